"""Atomic local file writes (torch-free): a file is either its old content or its new content, never half."""

from __future__ import annotations

import os
import tempfile

__all__ = ["fsync_dir", "write_file_atomic"]


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
