"""The retry rule: whether a failure is worth retrying, and the error a full or read-only storage becomes.

The exception classes live in ``prefect_gliner2.session_core.errors`` (one tree, drawn there); the ones the Prefect
layer raises (WorkerDied, WorkerError, LeaseUnreadableError, RunKeyError, RunConflictError, RunLockedError,
StorageFullError) are re-exported here, beside the rule that classifies them.

A retry helps only when the failure is transient: ``is_transient`` is False for every SessionCoreError (bad data,
non-finite loss, config/plan/checkpoint mismatch, a locked run key) and for a write that failed because the storage
is full, over a size or quota limit, or read-only (an OSError with one of those errnos anywhere in the exception's
cause/context chain: retrying in seconds only repeats the failure); it is True for everything else.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

from prefect_gliner2.session_core.errors import (
    LeaseUnreadableError,
    RunConflictError,
    RunKeyError,
    RunLockedError,
    SessionCoreError,
    StorageFullError,
    WorkerDied,
    WorkerError,
)

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
