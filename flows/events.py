"""The Prefect events automations can act on: their names, resources and payloads (all URIs absolute).

Training runs (resource ``prefect-gliner2.run.RUN_KEY``, with ``prefect-gliner2.run-key`` and the flow run id):

- ``prefect-gliner2.run.started``: a new run key starts training.
- ``prefect-gliner2.run.resumed``: a run key continues from its durable cursor; ``resumes_flow_run`` names the
  flow run that held the run key before (the crashed or failed one).
- ``prefect-gliner2.checkpoint.committed``: a checkpoint is complete and the durable cursor points at it
  (emitted by the checkpoint task).
- ``prefect-gliner2.validation.completed``: a validation finished; ``metrics`` holds its values.
- ``prefect-gliner2.run.completed``: the model is exported; ``export`` is where it is.
- ``prefect-gliner2.run.failed``: the run stopped with an error (``error``); rerun the run key to resume.

Retraining (resource ``prefect-gliner2.model.NAME``): ``prefect-gliner2.model.promoted`` and
``prefect-gliner2.model.rejected``, emitted by the retraining flow.

Local storage is reported as absolute paths (``/srv/runs/ner-v1``), any other storage as full fsspec URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect.events import emit_event

from prefect_gliner2.session_core.storage import absolute_uri
from prefect_gliner2.tasks.checkpoints import CHECKPOINT_EVENT, run_resource

if TYPE_CHECKING:
    from prefect_gliner2.runtime.live_runs import LiveRun
    from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory


__all__ = [
    "CHECKPOINT_EVENT",
    "MODEL_PROMOTED",
    "MODEL_REJECTED",
    "RUN_COMPLETED",
    "RUN_FAILED",
    "RUN_RESUMED",
    "RUN_STARTED",
    "VALIDATION_COMPLETED",
    "absolute_uri",
    "emit_failed",
    "emit_model_event",
    "emit_run_event",
    "emit_start",
]

RUN_STARTED = "prefect-gliner2.run.started"
RUN_RESUMED = "prefect-gliner2.run.resumed"
VALIDATION_COMPLETED = "prefect-gliner2.validation.completed"
RUN_COMPLETED = "prefect-gliner2.run.completed"
RUN_FAILED = "prefect-gliner2.run.failed"
MODEL_PROMOTED = "prefect-gliner2.model.promoted"
MODEL_REJECTED = "prefect-gliner2.model.rejected"


def emit_run_event(event: str, run_key: str, flow_run_id: str | None, payload: dict[str, Any]) -> None:
    """Emit a run event on the run key's resource; the payload also names the run key and flow run."""
    emit_event(
        event=event,
        resource=run_resource(run_key),
        payload={"run_key": run_key, "flow_run_id": flow_run_id, **payload},
    )


def emit_model_event(event: str, name: str, version: str, payload: dict[str, Any]) -> None:
    emit_event(
        event=event,
        resource={
            "prefect.resource.id": f"prefect-gliner2.model.{name}",
            "prefect.resource.name": name,
            "version": version,
        },
        payload={"model_name": name, "version": version, **payload},
    )


def emit_start(live: LiveRun, cursor: DurableCursor | None, previous: str | None, export_uri: str) -> None:
    """run.started for a run key's first training, run.resumed (naming the previous flow run) for a continuation."""
    payload: dict[str, Any] = {
        "run_dir": live.run_dir.uri,
        "manifest": live.run_dir.manifest_uri,
        "export": export_uri,
        "batch_count": live.plan.batch_count,
        "max_steps": live.plan.max_steps,
        "plan_fingerprint": live.fingerprint,
    }
    if cursor is None:
        emit_run_event(RUN_STARTED, live.run_key, live.flow_run_id, {**payload, "previous_flow_run": previous})
        return
    resumed: dict[str, Any] = {"resumes_flow_run": previous, "cursor": cursor.cursor, "step": cursor.step}
    resumed["checkpoint"] = live.run_dir.checkpoint_uri(cursor.checkpoint)
    emit_run_event(RUN_RESUMED, live.run_key, live.flow_run_id, {**payload, **resumed})


def emit_failed(run_dir: RunDirectory, flow_run_id: str | None, exc: BaseException) -> None:
    """run.failed with the error and the durable position (never raises: the run's own error is what matters)."""
    try:
        cursor = run_dir.read_cursor()
        payload = {"run_dir": run_dir.uri, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        payload |= {"cursor": cursor.cursor if cursor else 0, "step": cursor.step if cursor else 0}
        emit_run_event(RUN_FAILED, run_dir.run_key, flow_run_id, payload)
    except Exception:  # noqa: BLE001 - the run's own error is what matters
        from prefect import get_run_logger

        get_run_logger().warning("could not emit %s for run %s", RUN_FAILED, run_dir.run_key)
