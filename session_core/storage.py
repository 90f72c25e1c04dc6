"""Where bytes land on fsspec storage: local or not, one atomic-write policy, directory commits, debris (torch-free).

Every module that writes run directories, checkpoints, exports, manifests or the model registry goes through here,
so the storage policy is decided in one place:

- ``is_local(fs)``: local storage is fsspec's ``LocalFileSystem`` (plain and relative paths, ``file://``); anything
  else (``memory://``, ``s3://``, ``gs://``, ...) is remote.
- ``write_atomic(fs, path, data)``: a reader sees the old content or the new content, never a mix. Locally the
  bytes go to a hidden temporary sibling (mode 0o600) which is fsynced, renamed over `path`, and the directory
  fsynced. Remotely they are one object write of the complete bytes (``pipe_file``), which object stores apply
  atomically: no temporary object, no move.
- ``atomic_file(uri)``: the same guarantee for a file streamed through a handle (too large to hold in memory):
  a local temporary sibling renamed into place, or a local temporary file uploaded as one object.
- ``directory_commit(uri, marker)``: a directory whose marker file (``checkpoint.json``, ``export.json``) is
  written last. Locally the directory is staged as a hidden sibling (``layout.staging_name``), every file and
  directory in it fsynced (the fsyncs in flight together: ``durability``), and renamed into place, so a kill
  leaves nothing or all of it. Remotely a pending marker (``layout.PENDING_FILE``) is written
  first, then the files in place, then the marker, then the pending marker is removed; readers treat a directory
  without its marker as absent, and a new commit to a destination holding our pending marker but no marker
  replaces that debris of a killed upload (anything else non-empty is refused). The local copy a remote commit
  uploads from (``local_dir``) is ``$TMPDIR/prefect-gliner2-upload-<pid>-*``: removed on every path, and after a
  kill by the next remote commit or model load on the machine (``clean_stale_temp``). ``upload_progress`` is
  the test seam called after each uploaded object. A new remote policy (for example a unique prefix per
  attempt with the marker naming it) is another ``DirectoryCommit`` class chosen in ``directory_commit``; callers
  do not change.
- ``remove_debris(fs, folder)``: deletes what a killed writer left in `folder` (``layout.is_debris``); call it only
  while holding the run's lease, so no live writer owns those names.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.durability import SyncBatch, fsync_dir

__all__ = [
    "absolute_uri",
    "TEMP_PREFIX",
    "atomic_file",
    "DirectoryCommit",
    "LocalDirectoryCommit",
    "RemoteDirectoryCommit",
    "clean_stale_temp",
    "directory_commit",
    "interrupted_commit",
    "fsync_dir",
    "is_local",
    "open_new_local",
    "process_alive",
    "process_start",
    "remove_debris",
    "remove_uncommitted",
    "resolve",
    "set_upload_hook",
    "upload_progress",
    "write_atomic",
]


TEMP_PREFIX = "prefect-gliner2-"
_UPLOAD_HOOK: list[Callable[[str], None]] = []

logger = logging.getLogger(__name__)


def set_upload_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function upload_progress calls (test fault injection)."""
    _UPLOAD_HOOK[:] = [hook] if hook is not None else []


def upload_progress(what: str) -> None:
    for hook in list(_UPLOAD_HOOK):
        hook(what)


def is_local(fs: Any) -> bool:
    """True for the local filesystem (plain or relative paths, ``file://``); False for every other fsspec store."""
    return isinstance(fs, LocalFileSystem)


def absolute_uri(uri: str) -> str:
    """A local path made absolute (``~`` expanded); a URL with a protocol as it is (for records read elsewhere)."""
    return uri if "://" in uri else os.path.abspath(os.path.expanduser(uri))


def resolve(uri: str | os.PathLike[str]) -> tuple[Any, str]:
    """(filesystem, path without trailing slash) of a local path or fsspec URL; local paths come back absolute."""
    fs, path = fsspec.core.url_to_fs(os.fspath(uri))
    return fs, path.rstrip("/") or path


# ---- single files ------------------------------------------------------------------------------------------


def write_atomic(fs: Any, path: str, data: bytes) -> None:
    """Replace the file at `path` with `data` atomically (see the module docstring for the local/remote policy)."""
    if is_local(fs):
        _write_local_file(path, data)
        return
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        try:
            fs.makedirs(parent, exist_ok=True)
        except OSError:
            pass  # object stores have no directories
    fs.pipe_file(path, data)  # one object write of the complete bytes: atomic on object stores


def _write_local_file(path: str, data: bytes) -> None:
    """Local half of ``write_atomic``: a hidden ``.<name>.*.tmp`` sibling (0o600), fsync, rename, fsync the directory.

    A kill at any moment leaves the old file or the new one, plus at most a temporary file ``remove_debris`` finds.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=layout.temp_prefix(os.path.basename(path)), suffix=layout.TEMP_SUFFIX, dir=directory
    )
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


@contextmanager
def open_new_local(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A new local file (refused if it exists; mode 0o600) to stream into; flushed and fsynced on close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def atomic_file(uri: str) -> Iterator[IO[bytes]]:
    """A file at `uri` written through the yielded binary handle and published whole when the block ends (nothing
    is published if it raises): locally a hidden temporary sibling, fsynced and renamed over `uri`; elsewhere a
    local temporary file uploaded as one object (``put_file``: an object store shows the object only once the
    upload completes). For outputs too large to hold in memory (``write_atomic`` takes the bytes)."""
    fs, path = resolve(uri)
    if is_local(fs):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=layout.temp_prefix(os.path.basename(path)), suffix=layout.TEMP_SUFFIX, dir=directory
        )
    else:
        clean_stale_temp()
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}upload-{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if is_local(fs):
            os.replace(tmp, path)
            fsync_dir(os.path.dirname(path))
        else:
            parent = path.rsplit("/", 1)[0] if "/" in path else ""
            if parent:
                try:
                    fs.makedirs(parent, exist_ok=True)
                except OSError:
                    pass  # object stores have no directories
            fs.put_file(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- directories committed by a marker written last --------------------------------------------------------


class DirectoryCommit(ABC):
    """Builds one directory at `uri` whose `marker` file is written last; use as a context manager.

    ``write(name, data)`` adds a file (``open(name)`` streams one); ``local_dir()`` is a local folder whose contents
    become part of the directory (for libraries that write files themselves, such as ``save_pretrained``);
    ``commit(marker_bytes)`` makes the directory visible. Leaving the ``with`` block without a commit removes the
    local staging (remote files written in place stay as uncommitted debris for ``remove_uncommitted``).
    `before_commit` runs once everything but the marker is in place.
    """

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
        handle = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
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


def directory_commit(
    uri: str, marker: str, *, what: str, before_commit: Callable[[], None] | None = None
) -> DirectoryCommit:
    """A commit of a new directory at `uri` under this storage's policy; refuses a destination that is not empty,
    except (remote storage) the debris of an interrupted commit: our pending marker and no `marker`.

    `what` names the directory in the error ("checkpoint", "export").
    """
    fs, path = resolve(uri)
    if fs.exists(path) and (not fs.isdir(path) or fs.ls(path)):
        if is_local(fs) or not interrupted_commit(fs, path, marker):
            raise FileExistsError(f"{what} destination {uri} already exists and is not empty; choose a new location")
        logger.warning("replacing the incomplete %s at %s (its upload was interrupted)", what, uri)
        fs.rm(path, recursive=True)
    policy = LocalDirectoryCommit if is_local(fs) else RemoteDirectoryCommit
    return policy(fs, path, uri, marker, before_commit)


def interrupted_commit(fs: Any, path: str, marker: str) -> bool:
    """A remote directory holding our pending marker but not `marker`: a commit that was killed mid-upload."""
    return bool(fs.exists(f"{path}/{layout.PENDING_FILE}")) and not fs.exists(f"{path}/{marker}")


def clean_stale_temp() -> list[str]:
    """Remove temp copies (``prefect-gliner2-<kind>-<pid>-*``) whose process is gone: left by a kill."""
    removed = []
    for entry in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*-*"):
        parts = entry.name[len(TEMP_PREFIX) :].split("-")
        if len(parts) < 3 or not parts[1].isdigit() or process_alive(int(parts[1])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    return removed


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: Any, start: Any = None) -> bool:
    """False only when process `pid` is provably gone on this host: no such pid, a zombie, or a pid reused by a
    process started at another time than `start` (from ``process_start``); True when it cannot tell."""
    if not isinstance(pid, int):
        return True  # cannot tell: not provably gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False  # a zombie: dead, not yet reaped
    except (OSError, IndexError):
        pass
    current = process_start(pid)
    return start is None or current is None or current == start
    return True


# ---- debris --------------------------------------------------------------------------------------------------


def remove_debris(fs: Any, folder: str, of: str | None = None) -> list[str]:
    """Delete staging leftovers in `folder` (only those of target name `of`, when given); returns their names.

    Call only while holding the run's lease: no live writer may own the names removed.
    """
    if not fs.exists(folder):
        return []
    removed = []
    for entry in fs.ls(folder, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if layout.is_debris(name, of):
            fs.rm(entry, recursive=True)
            removed.append(name)
    return removed


def remove_uncommitted(uri: str) -> list[str]:
    """Delete an uncommitted directory at `uri` (the caller checked that its marker is absent) and its staging
    leftovers; returns what was removed. Call only while holding the run's lease."""
    fs, path = resolve(uri)
    removed = []
    if fs.exists(path):
        fs.rm(path, recursive=True)
        removed.append(path.rsplit("/", 1)[-1])
    if "/" in path:
        parent, name = path.rsplit("/", 1)
        removed += remove_debris(fs, parent, of=name)
    return removed
