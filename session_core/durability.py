"""Making many local files durable at once: their fsyncs issued together, so the filesystem commits them together.

A journaling filesystem (ext4, xfs) turns each ``fsync`` into a journal commit that waits for the disk; fsyncs
issued one after another wait once each (about 4 ms apiece on this project's machines, tens of milliseconds for a
checkpoint's ten files), while fsyncs in flight at the same time join one commit. A ``SyncBatch`` hands each
finished file to a shared pool of I/O threads that fsync it (and close it) while the caller goes on; ``wait()``
returns once every file and directory handed to it is durable, raising the first failure. Nothing here weakens
durability: each file is fsynced, and so is each directory whose entries must survive, before ``wait()`` returns.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["SYNC_THREADS", "SyncBatch", "fsync_dir"]

#: Threads issuing fsyncs (they wait on the disk, not the CPU).
SYNC_THREADS = 16

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _sync_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="fsync")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool = None  # a forked child has none of the parent's threads, and maybe a lock one of them held
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries (creations, renames) of directory `path` durable (best effort where the filesystem cannot
    fsync a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_and_close(handle: IO[bytes]) -> None:
    try:
        os.fsync(handle.fileno())
    finally:
        handle.close()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SyncBatch:
    """fsyncs in flight together (see the module docstring). Not for use from several threads at once."""

    def __init__(self) -> None:
        self._jobs: list[concurrent.futures.Future[Any]] = []

    def add_handle(self, handle: IO[bytes]) -> None:
        """fsync, then close, this open file (flushed by the caller) in the background."""
        self._jobs.append(_sync_pool().submit(_fsync_and_close, handle))

    def add_path(self, path: Path) -> None:
        """fsync the file at `path` (written and closed elsewhere, e.g. by a library) in the background."""
        self._jobs.append(_sync_pool().submit(_fsync_path, path))

    def add_dir(self, path: Path) -> None:
        """fsync directory `path` in the background (add it once every entry it must keep exists)."""
        self._jobs.append(_sync_pool().submit(fsync_dir, path))

    def wait(self) -> None:
        """Return once everything added is durable; raises the first failure (all jobs have ended by then)."""
        jobs, self._jobs = self._jobs, []
        concurrent.futures.wait(jobs)
        for job in jobs:
            job.result()
