"""Emitting the run's Prefect events from the flows; their names, resources and payloads are in runtime/events.py
(and the "Events" table of docs/what-you-see.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect.events import emit_event

from prefect_gliner2.runtime.events import RUN_FAILED, failed_event, model_event, run_event, start_event

if TYPE_CHECKING:
    from prefect_gliner2.runtime.live_runs import LiveRun
    from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory


__all__ = ["emit_failed", "emit_model_event", "emit_run_event", "emit_start"]


def emit_run_event(event: str, run_key: str, flow_run_id: str | None, payload: dict[str, Any]) -> None:
    """Emit a run event on the run key's resource; the payload also names the run key and flow run."""
    emit_event(**run_event(event, run_key, flow_run_id, payload))


def emit_model_event(event: str, name: str, version: str, payload: dict[str, Any]) -> None:
    emit_event(**model_event(event, name, version, payload))


def emit_start(live: LiveRun, cursor: DurableCursor | None, previous: str | None, export_uri: str) -> None:
    """run.started for a run key's first training, run.resumed (naming the previous flow run) for a continuation."""
    emit_event(**start_event(live, cursor, previous, export_uri))


def emit_failed(run_dir: RunDirectory, flow_run_id: str | None, exc: BaseException) -> None:
    """run.failed with the error and the durable position (never raises: the run's own error is what matters)."""
    try:
        emit_event(**failed_event(run_dir, flow_run_id, exc))
    except Exception:  # noqa: BLE001 - the run's own error is what matters
        from prefect import get_run_logger

        get_run_logger().warning("could not emit %s for run %s", RUN_FAILED, run_dir.run_key)
