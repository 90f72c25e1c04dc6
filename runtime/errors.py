"""The retry rule: whether a failure is worth retrying, and the error a full or read-only storage becomes.

The run-level errors are defined here, in the layer that raises them (WorkerDied, WorkerError, LeaseUnreadableError,
RunKeyError, RunConflictError, RunLockedError, StorageFullError), beside the rule that classifies them; they derive
from the bases in ``prefect_gliner2.session_core.errors``, whose docstring draws the one tree.

A retry helps only when the failure is transient: ``is_transient`` is False for every SessionCoreError (bad data,
non-finite loss, config/plan/checkpoint mismatch, a locked run key) and for a write that failed because the storage
is full, over a size or quota limit, or read-only (an OSError with one of those errnos anywhere in the exception's
cause/context chain: retrying in seconds only repeats the failure); it is True for everything else.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError, PlanMismatchError, SessionCoreError, TransientError

__all__ = [
    "exception_chain",
    "LeaseUnreadableError",
    "RunConflictError",
    "RunKeyError",
    "RunLockedError",
    "StorageFullError",
    "WorkerDied",
    "WorkerError",
    "is_transient",
    "permanent_storage_errno",
    "retry_if_transient",
]


class RunKeyError(ConfigError):
    """A run key that cannot name a run directory safely."""


class RunConflictError(PlanMismatchError):
    """The run key already holds a run with a different manifest or different run settings."""


class RunLockedError(SessionCoreError, RuntimeError):
    """Another live flow run holds the lease on this run key."""


class StorageFullError(SessionCoreError, OSError):
    """A write failed because the storage is full, past a file-size or quota limit, or read-only: not retried."""

    def __init__(self, code: int, message: str) -> None:
        OSError.__init__(self, code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errno, self.message), dict(self.__dict__))


class WorkerDied(TransientError):
    """The session worker process died; a retry starts a fresh one from the newest committed checkpoint."""


class WorkerError(TransientError):
    """An unexpected exception inside the worker (not one of ours); the worker was discarded."""

    def __init__(self, message: str, remote_traceback: str = "", remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback
        self.remote_type = remote_type  # the exception's type in the worker, e.g. "RuntimeError"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.remote_traceback, self.remote_type), dict(self.__dict__))


class LeaseUnreadableError(TransientError):
    """The run key's lease record could not be read or listed: the key is not treated as free."""


#: errnos of a write that cannot succeed until someone frees space, raises a limit or remounts the storage.
PERMANENT_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then the exception it was raised from or while handling (``__cause__``, else ``__context__``), and so
    on, as a traceback prints them; each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def permanent_storage_errno(exc: BaseException | None) -> int | None:
    """The errno of a full / size-limited / read-only storage failure in ``exc``'s cause/context chain, else None."""
    for linked in exception_chain(exc):
        if isinstance(linked, OSError) and linked.errno in PERMANENT_STORAGE_ERRNOS:
            return linked.errno
    return None


def storage_full_error(code: int, detail: str) -> StorageFullError:
    """The error a flow reports for a permanent storage failure, saying what to do."""
    return StorageFullError(
        code,
        (
            f"a write failed with {errno.errorcode.get(code, code)} ({detail}): the storage is full, "
            "over a file-size or "
            "quota limit, or read-only, so retrying would fail again. Nothing committed was lost: free space (or raise "
            "the limit, or make the storage writable) and run the same run key again; it continues exactly from the "
            "newest committed checkpoint"
        ),
    )


def is_transient(exc: BaseException | None) -> bool:
    """True when retrying could help: not a deterministic SessionCoreError, not a full or read-only storage."""
    return exc is not None and not isinstance(exc, SessionCoreError) and permanent_storage_errno(exc) is None


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
