"""Validation and export tasks.

``validate`` runs the validation due after batch i (it advances the session there first, so it is safe after a
restore or a cached batch task) and returns the metrics plus best-model/early-stopping state. ``export_model``
writes the selected model: the best validation checkpoint's weights when validation selected one, else the final
weights; re-running it after a crash finds the finished export and returns its record.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from .training import POSITION_TASK, RETRYING, call_worker

__all__ = ["export_model", "validate"]


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
        index, result.get("step"), metrics.get("eval_loss"), result.get("best_metric"), result.get("best_step"),
        "; early stopping" if result.get("stopped_early") else "",
    )
    return dict(result)


@task(
    name="export-model",
    task_run_name="export {which} model",
    cache_policy=NO_CACHE,
    **RETRYING,
)
def export_model(run_key: str, uri: str, which: str = "best") -> dict[str, Any]:
    """Export the best model (when validation selected one) or the final model to `uri`."""
    info = call_worker(run_key, "export", uri=uri, which=which)
    get_run_logger().info("exported the %s model (step %s) to %s", info.get("label"), info.get("step"), uri)
    return dict(info)
