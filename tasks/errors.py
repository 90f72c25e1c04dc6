"""Errors of the Prefect layer, and the one rule that decides whether a failure is worth retrying.

    RuntimeError
    ├── WorkerDied                 the session worker process vanished (kill, OOM, segfault): transient
    └── WorkerError                an unexpected (non-session_core) exception inside the worker: transient
    session_core.SessionCoreError  deterministic, never retried; the Prefect layer adds:
    ├── RunKeyError (ConfigError)              a run key that is not a safe directory name
    ├── RunConflictError (PlanMismatchError)   a different manifest / settings under an existing run key
    └── RunLockedError (SessionCoreError, RuntimeError)  another live run holds the run key's lease

A retry helps only when the failure is transient: ``is_transient`` is False for every SessionCoreError (bad data,
non-finite loss, config/plan/checkpoint mismatch, a locked run key) and True for everything else.
"""

from __future__ import annotations

from typing import Any

from session_core.errors import ConfigError, PlanMismatchError, SessionCoreError

__all__ = [
    "RunConflictError",
    "RunKeyError",
    "RunLockedError",
    "WorkerDied",
    "WorkerError",
    "is_transient",
    "retry_if_transient",
]


class WorkerDied(RuntimeError):
    """The session worker process died; a retry starts a fresh one from the newest committed checkpoint."""


class WorkerError(RuntimeError):
    """An unexpected exception inside the worker (not a session_core error); the worker was discarded."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.remote_traceback))


class RunKeyError(ConfigError):
    """A run key that cannot name a run directory safely."""


class RunConflictError(PlanMismatchError):
    """The run key already holds a run with a different manifest or different run settings."""


class RunLockedError(SessionCoreError, RuntimeError):
    """Another live flow run holds the lease on this run key."""


def is_transient(exc: BaseException | None) -> bool:
    """True when retrying could help: anything that is not a deterministic SessionCoreError."""
    return exc is not None and not isinstance(exc, SessionCoreError)


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry worker deaths and other transient failures, never SessionCoreError."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            state.result(raise_on_failure=True)
        except BaseException as raised:  # noqa: BLE001 - we only classify it
            exc = raised
        else:
            return False
    return is_transient(exc)
