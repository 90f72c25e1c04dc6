"""The validation task: the validation due after batch i, with best selection and early stopping.

``validate`` advances the session to batch i first, so it is safe after a restore or a cached batch task, and
returns the metrics plus best-model/early-stopping state.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from prefect_gliner2.tasks.training import POSITION_TASK, call_worker

__all__ = ["validate"]


@task(
    name="validate",
    task_run_name="validate after batch {index}",
    **POSITION_TASK,
)
def validate(run_key: str, index: int) -> dict[str, Any]:
    """The validation after batch `index`: native eval losses, best selection, early stopping."""
    result = call_worker(run_key, "validate", index=index)
    metrics = result.get("metrics") or {}
    get_run_logger().info(
        "validation after batch %d (step %s): eval_loss %s; best %s at step %s%s",
        index,
        result.get("step"),
        metrics.get("eval_loss"),
        result.get("best_metric"),
        result.get("best_step"),
        "; early stopping" if result.get("stopped_early") else "",
    )
    return dict(result)
