"""Directory commits: one directory whose marker file is written last, one class per storage policy (torch-free).

``storage.directory_commit`` picks the policy for a URI and refuses a destination that is not empty; the local and
remote policies are described in the ``storage`` module docstring and on each class below. ``upload_progress`` is the
test seam a remote commit calls after each uploaded object (``set_upload_hook`` installs the fault injector).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.direct_io import open_direct, open_new_file
from prefect_gliner2.session_core.durability import SyncBatch, fsync_dir
from prefect_gliner2.session_core.tempcopies import TEMP_PREFIX, clean_stale_temp

__all__ = [
    "DirectoryCommit",
    "LocalDirectoryCommit",
    "RemoteDirectoryCommit",
    "set_upload_hook",
    "upload_progress",
]

_UPLOAD_HOOK: list[Callable[[str], None]] = []


def set_upload_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function upload_progress calls (test fault injection)."""
    _UPLOAD_HOOK[:] = [hook] if hook is not None else []


def upload_progress(what: str) -> None:
    for hook in list(_UPLOAD_HOOK):
        hook(what)


class DirectoryCommit(ABC):
    """Builds one directory at `uri` whose `marker` file is written last; use as a context manager.

    ``write(name, data)`` adds a file (``open(name)`` streams one); ``local_dir()`` is a local folder whose contents
    become part of the directory (for libraries that write files themselves, such as ``save_pretrained``);
    ``commit(marker_bytes)`` makes the directory visible. Leaving the ``with`` block without a commit removes the
    local staging (remote files written in place stay as uncommitted debris for ``remove_uncommitted``).
    `before_commit` runs once everything but the marker is in place. With `direct` (set by ``directory_commit`` on
    local storage only: an upload reads its files back at once), files streamed through ``open`` are written around
    the page cache (``direct_io``): for directories nobody reads back soon.
    """

    direct = False

    def __init__(self, fs: Any, path: str, uri: str, marker: str, before_commit: Callable[[], None] | None) -> None:
        self.fs, self.path, self.uri, self.marker = fs, path, uri, marker
        self.before_commit = before_commit

    def __enter__(self) -> DirectoryCommit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def write(self, name: str, data: bytes) -> None:
        """See the class docstring."""
        with self.open(name) as handle:
            handle.write(data)

    @abstractmethod
    def open(self, name: str) -> Any:
        """A context manager: a binary handle to stream file `name` into (durable once the block exits)."""

    @abstractmethod
    def local_dir(self) -> Path:
        """See the class docstring."""

    @abstractmethod
    def commit(self, marker_bytes: bytes) -> None:
        """See the class docstring."""

    @abstractmethod
    def discard(self) -> None:
        """See the class docstring."""


class LocalDirectoryCommit(DirectoryCommit):
    """Local policy: stage as a hidden sibling (0o700 directory, 0o600 files), make every file and directory in it
    durable (their fsyncs in flight together: ``durability.SyncBatch``), then one rename and an fsync of the parent.

    A file streamed through `open` is fsynced in the background as soon as it is complete; files a library wrote
    into `local_dir` are found and fsynced at the commit. The marker is written after every other file; nothing in
    the staging directory is visible until the rename, which waits for all of them to be durable."""

    def __init__(self, fs: Any, path: str, uri: str, marker: str, before_commit: Callable[[], None] | None) -> None:
        super().__init__(fs, path, uri, marker, before_commit)
        parent = os.path.dirname(os.path.abspath(path)) or "."
        os.makedirs(parent, mode=0o700, exist_ok=True)
        self.parent = parent
        self.staging = Path(parent) / layout.staging_name(os.path.basename(path))
        self.staging.mkdir(mode=0o700)
        self._syncs = SyncBatch()
        self._streamed: set[Path] = set()

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        path = self.staging / name
        handle: Any = open_direct(path) if self.direct else open_new_file(path)
        try:
            yield handle
            handle.flush()
        except BaseException:
            handle.close()
            raise
        self._streamed.add(path)
        self._syncs.add_handle(handle)  # fsynced (and closed) while the next file is written

    def local_dir(self) -> Path:
        return self.staging

    def commit(self, marker_bytes: bytes) -> None:
        self.write(self.marker, marker_bytes)
        for path in sorted(self.staging.rglob("*")):
            if path.is_dir():
                self._syncs.add_dir(path)
            elif path not in self._streamed:
                self._syncs.add_path(path)  # written by a library into local_dir()
        self._syncs.add_dir(self.staging)
        self._syncs.wait()
        if self.before_commit is not None:
            self.before_commit()
        if os.path.isdir(self.path):
            os.rmdir(self.path)  # an empty directory someone created for us
        os.rename(self.staging, self.path)
        fsync_dir(self.parent)

    def discard(self) -> None:
        try:
            self._syncs.wait()  # every handle closed before the staging goes
        except OSError:
            pass  # the failure that matters was raised to the writer already
        if self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)


class RemoteDirectoryCommit(DirectoryCommit):
    """Remote policy: a pending marker first, files written in place (``local_dir`` contents uploaded at commit),
    the marker last, then the pending marker removed."""

    def __init__(self, fs: Any, path: str, uri: str, marker: str, before_commit: Callable[[], None] | None) -> None:
        super().__init__(fs, path, uri, marker, before_commit)
        self._local: Path | None = None
        self._made = False

    def _ensure_dir(self) -> None:
        if not self._made:
            self.fs.makedirs(self.path, exist_ok=True)
            pending = {"uri": self.uri, "marker": self.marker, "pid": os.getpid(), "started": time.time()}
            self.fs.pipe_file(f"{self.path}/{layout.PENDING_FILE}", json.dumps(pending).encode())
            self._made = True

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        self._ensure_dir()
        with self.fs.open(f"{self.path}/{name}", "wb") as handle:
            yield handle
        upload_progress(self.marker)

    def local_dir(self) -> Path:
        if self._local is None:
            clean_stale_temp()
            self._local = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}upload-{os.getpid()}-"))
        return self._local

    def commit(self, marker_bytes: bytes) -> None:
        self._ensure_dir()
        if self._local is not None:
            for local in sorted(p for p in self._local.rglob("*") if p.is_file()):
                self.fs.put_file(str(local), f"{self.path}/{local.relative_to(self._local).as_posix()}")
                upload_progress(self.marker)
        if self.before_commit is not None:
            self.before_commit()
        with self.fs.open(f"{self.path}/{self.marker}", "wb") as handle:
            handle.write(marker_bytes)
        self.fs.rm(f"{self.path}/{layout.PENDING_FILE}")

    def discard(self) -> None:
        if self._local is not None and self._local.exists():
            shutil.rmtree(self._local, ignore_errors=True)
