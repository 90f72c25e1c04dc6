"""Atomic local file writes (torch-free): a file is either its old content or its new content, never half.

Also the one test seam of multi-object uploads to object storage: ``upload_progress(stage)`` is called after the
first object of a checkpoint or export upload (nothing happens unless a hook is set; the worker's fault injection
sets one to kill a process mid-upload).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

__all__ = ["fsync_dir", "set_upload_hook", "upload_progress", "write_file_atomic"]

_UPLOAD_HOOK: list[Callable[[str], None]] = []


def set_upload_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function called by upload_progress."""
    _UPLOAD_HOOK[:] = [hook] if hook is not None else []


def upload_progress(stage: str) -> None:
    for hook in list(_UPLOAD_HOOK):
        hook(stage)


def fsync_dir(path: str) -> None:
    """Make a rename inside `path` durable (best effort where the filesystem cannot fsync a directory)."""
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


def write_file_atomic(path: str, data: bytes) -> None:
    """Write `data` to a hidden `.<name>.*.tmp` sibling (mode 0o600), fsync it, rename it over `path`, fsync the
    directory. A kill at any moment leaves the old file or the new one, plus at most a `.tmp` file to clean."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
