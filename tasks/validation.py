"""The validation task: the validation due after batch i, with best selection and early stopping.

``validate`` advances the session to batch i first, so it is safe after a restore or a cached batch task, and
returns the metrics plus best-model/early-stopping state.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from prefect_gliner2.runtime.protocol import Validate, ValidateResult
from prefect_gliner2.session_core.score_text import validation_scores
from prefect_gliner2.tasks.training import POSITION_TASK, call_worker

__all__ = ["validate", "validation_line"]


@task(
    name="validate",
    task_run_name="validate after batch {index}",
    **POSITION_TASK,
)
def validate(run_key: str, index: int) -> ValidateResult:
    """The validation after batch `index`: extraction P/R/F1 and native eval losses, best selection, early stopping."""
    result = call_worker(run_key, Validate(index=index))
    get_run_logger().info("%s", validation_line(index, result))
    return result


def _short(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"


def validation_line(index: int, result: ValidateResult) -> str:
    """One log line for a validation: F1, P, R, the loss and where the best stands."""
    metrics = result.metrics or {}
    parts = [f"validation after batch {index} (step {result.step}):"]
    if "eval_f1" in metrics:
        parts.append(validation_scores(metrics) + ";")
    parts.append(f"eval_loss {_short(metrics.get('eval_loss'))};")
    parts.append(f"best {_short(result.best_metric)} at step {result.best_step}")
    return " ".join(parts) + ("; early stopping" if result.stopped_early else "")
