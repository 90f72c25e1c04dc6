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

from typing import Any

from prefect.events import emit_event

from prefect_gliner2.session_core.storage import absolute_uri
from prefect_gliner2.tasks.checkpoints import CHECKPOINT_EVENT, run_resource

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
    "emit_model_event",
    "emit_run_event",
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
