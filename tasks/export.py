"""The export task: write the selected model once.

``export_model`` writes the best validation checkpoint's weights when validation selected one, else the final
weights, with the extraction thresholds fitted for them on the validation data (export.json); re-running it after
a crash finds the finished export and returns its record.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.runtime import live_runs
from prefect_gliner2.runtime.protocol import Export, ExportResult
from prefect_gliner2.session_core.thresholds import describe
from prefect_gliner2.tasks.training import RETRYING, call_worker

__all__ = ["export_model"]


@task(
    name="export-model",
    task_run_name="export {which} model",
    cache_policy=NO_CACHE,
    **RETRYING,
)
def export_model(run_key: str, uri: str, which: str = "best") -> ExportResult:
    """Export the best model (when validation selected one) or the final model to `uri`."""
    live_runs.get(run_key).lease.check()  # a run that lost its run key publishes nothing
    info = call_worker(run_key, Export(uri=uri, which=which))
    get_run_logger().info(
        "exported the %s model (weights of step %s) to %s; %s", info.label, info.step, uri, describe(info.thresholds)
    )
    return info
