"""The validation task: the validation due after batch i, with best selection and early stopping.

``validate`` advances the session to batch i first, so it is safe after a restore or a cached batch task, and
returns the metrics plus best-model/early-stopping state.
"""

from __future__ import annotations

from prefect import get_run_logger, task

from prefect_gliner2.runtime.protocol import Validate, ValidateResult
from prefect_gliner2.tasks.training import POSITION_TASK, call_worker

__all__ = ["validate"]


@task(
    name="validate",
    task_run_name="validate after batch {index}",
    **POSITION_TASK,
)
def validate(run_key: str, index: int) -> ValidateResult:
    """The validation after batch `index`: native eval losses, best selection, early stopping."""
    result = call_worker(run_key, Validate(index=index))
    metrics = result.metrics or {}
    get_run_logger().info(
        "validation after batch %d (step %s): eval_loss %s; best %s at step %s%s",
        index,
        result.step,
        metrics.get("eval_loss"),
        result.best_metric,
        result.best_step,
        "; early stopping" if result.stopped_early else "",
    )
    return result
