"""The Prefect events automations can act on: their names, resources and payloads (built here, Prefect-free).

Training runs (resource ``prefect-gliner2.run.RUN_KEY``; every payload also names ``run_key`` and ``flow_run_id``):

- ``prefect-gliner2.run.started``: a new run key starts training.
- ``prefect-gliner2.run.resumed``: a run key continues from its durable cursor; ``resumes_flow_run`` names the
  flow run that held the run key before (the crashed or failed one).
- ``prefect-gliner2.checkpoint.committed``: a checkpoint is complete and the durable cursor points at it
  (emitted by the checkpoint task).
- ``prefect-gliner2.validation.completed``: a validation finished; ``metrics`` holds its values.
- ``prefect-gliner2.run.completed``: the model is exported; ``export`` is where it is.
- ``prefect-gliner2.run.failed``: the run stopped with an error (``error``); rerun the run key to resume.

Retraining (resource ``prefect-gliner2.model.NAME``): ``prefect-gliner2.model.promoted`` and
``prefect-gliner2.model.rejected``, emitted by the retraining flow; ``decision`` is the promotion decision
(``PromotionDecision.to_dict()``: both F1s with their intervals, the difference's interval, the per-label table with
verdicts, the guard-set result and the rule) and ``metrics`` the models' scores on the test records.

Local storage is reported as absolute paths (``/srv/runs/ner-v1``), any other storage as full fsspec URLs. Each
builder returns the keyword arguments of ``prefect.events.emit_event`` (``event``, ``resource``, ``payload``); the
tasks and flows emit them (``flows/events.py``, ``tasks/checkpoints.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_gliner2.runtime.live_runs import LiveRun
    from prefect_gliner2.runtime.protocol import CheckpointResult, ValidateResult
    from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory

__all__ = [
    "CHECKPOINT_COMMITTED",
    "MODEL_PROMOTED",
    "MODEL_REJECTED",
    "RUN_COMPLETED",
    "RUN_FAILED",
    "RUN_RESUMED",
    "RUN_STARTED",
    "VALIDATION_COMPLETED",
    "checkpoint_event",
    "failed_event",
    "model_event",
    "run_event",
    "run_resource",
    "start_event",
    "validation_event",
]

RUN_STARTED = "prefect-gliner2.run.started"
RUN_RESUMED = "prefect-gliner2.run.resumed"
CHECKPOINT_COMMITTED = "prefect-gliner2.checkpoint.committed"
VALIDATION_COMPLETED = "prefect-gliner2.validation.completed"
RUN_COMPLETED = "prefect-gliner2.run.completed"
RUN_FAILED = "prefect-gliner2.run.failed"
MODEL_PROMOTED = "prefect-gliner2.model.promoted"
MODEL_REJECTED = "prefect-gliner2.model.rejected"

# what a checkpoint.committed payload carries of the checkpoint task's result
CHECKPOINT_FIELDS = (
    "name",
    "uri",
    "cursor",
    "step",
    "epoch",
    "finished",
    "best_metric",
    "best_step",
    "existing",
    "cursor_moved",
    "pruned",
)


def run_resource(run_key: str) -> dict[str, str]:
    """The resource every training event of `run_key` is emitted on."""
    return {"prefect.resource.id": f"prefect-gliner2.run.{run_key}", "prefect.resource.name": run_key}


def run_event(event: str, run_key: str, flow_run_id: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    """A training event on the run key's resource; the payload also names the run key and flow run."""
    return {
        "event": event,
        "resource": run_resource(run_key),
        "payload": {"run_key": run_key, "flow_run_id": flow_run_id, **payload},
    }


def model_event(event: str, name: str, version: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A retraining decision on the model's resource."""
    return {
        "event": event,
        "resource": {
            "prefect.resource.id": f"prefect-gliner2.model.{name}",
            "prefect.resource.name": name,
            "version": version,
        },
        "payload": {"model_name": name, "version": version, **payload},
    }


def start_event(live: LiveRun, cursor: DurableCursor | None, previous: str | None, export_uri: str) -> dict[str, Any]:
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
        return run_event(RUN_STARTED, live.run_key, live.flow_run_id, {**payload, "previous_flow_run": previous})
    resumed: dict[str, Any] = {"resumes_flow_run": previous, "cursor": cursor.cursor, "step": cursor.step}
    resumed["checkpoint"] = live.run_dir.checkpoint_uri(cursor.checkpoint)
    return run_event(RUN_RESUMED, live.run_key, live.flow_run_id, {**payload, **resumed})


def checkpoint_event(live: LiveRun, info: CheckpointResult) -> dict[str, Any]:
    """checkpoint.committed: the committed checkpoint (named, with the cursor it moved) and what retention removed."""
    recorded = dataclasses.asdict(info)
    payload = {"run_dir": live.run_dir.uri, **{key: recorded[key] for key in CHECKPOINT_FIELDS}}
    return run_event(CHECKPOINT_COMMITTED, live.run_key, live.flow_run_id, payload)


def validation_event(
    run_key: str, flow_run_id: str | None, run_dir: str | None, result: ValidateResult, epoch: int
) -> dict[str, Any]:
    """validation.completed: the numeric metrics of one validation, its position (`epoch` 1-based) and the best."""
    metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    payload: dict[str, Any] = {"run_dir": run_dir, "metrics": metrics, "step": result.step}
    payload |= {"batch": result.index, "epoch": epoch}
    payload |= {"best_metric": result.best_metric, "best_step": result.best_step}
    return run_event(VALIDATION_COMPLETED, run_key, flow_run_id, payload)


def failed_event(run_dir: RunDirectory, flow_run_id: str | None, exc: BaseException) -> dict[str, Any]:
    """run.failed: the error (at most 2,000 characters) and the durable position (reads the cursor)."""
    cursor = run_dir.read_cursor()
    payload = {"run_dir": run_dir.uri, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    payload |= {"cursor": cursor.cursor if cursor else 0, "step": cursor.step if cursor else 0}
    return run_event(RUN_FAILED, run_dir.run_key, flow_run_id, payload)
