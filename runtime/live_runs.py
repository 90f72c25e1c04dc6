"""Live runs of this process, by run key: how a Prefect task reaches its run's worker without passing it around.

Task parameters stay tiny (run key, batch indices); the heavy, unpicklable things (the worker client, the lease)
live here for as long as the flow run that opened them.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.runtime.lease import RunLease
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker
from prefect_gliner2.session_core.errors import SessionStateError

__all__ = ["LiveRun", "close_all", "close_for_flow_run", "get", "lookup", "register", "unregister"]


@dataclass
class LiveRun:
    """Everything one live training run holds in the flow process."""

    run_key: str
    run_dir: RunDirectory
    fingerprint: str
    content_address: str
    worker: SessionWorker
    lease: RunLease
    flow_run_id: str | None = None
    plan: Any = None
    keep_checkpoints: int | None = None  # retention: None keeps every checkpoint

    def close(self) -> None:
        self.worker.close(wait=False)


_LIVE: dict[str, LiveRun] = {}
_LOCK = threading.Lock()


def register(run: LiveRun) -> None:
    with _LOCK:
        _LIVE[run.run_key] = run


def lookup(run_key: str) -> LiveRun | None:
    with _LOCK:
        return _LIVE.get(run_key)


def get(run_key: str) -> LiveRun:
    run = lookup(run_key)
    if run is None:
        raise SessionStateError(
            f"no live training run {run_key!r} in this process; batch, checkpoint and export tasks run inside "
            "train_flow, which opens the run (lease, run directory, session worker) first"
        )
    return run


def unregister(run_key: str, *, close: bool = True) -> None:
    with _LOCK:
        run = _LIVE.pop(run_key, None)
    if run is not None and close:
        run.close()


def close_for_flow_run(flow_run_id: str) -> None:
    """Close the live runs opened by one flow run (its final failure, crash or cancellation)."""
    with _LOCK:
        keys = [key for key, run in _LIVE.items() if run.flow_run_id == flow_run_id]
    for key in keys:
        unregister(key)


def close_all() -> None:
    with _LOCK:
        runs = list(_LIVE.values())
        _LIVE.clear()
    for run in runs:
        run.close()


atexit.register(close_all)
