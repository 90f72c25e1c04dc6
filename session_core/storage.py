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
  the test seam called after each uploaded object. The policies are classes in ``commits``; the temporary
  copies and process liveness live in ``tempcopies`` (both re-exported here). A new remote policy (for example a
  unique prefix per attempt with the marker naming it) is another ``DirectoryCommit`` class chosen in
  ``directory_commit``; callers do not change.
- ``remove_debris(fs, folder)``: deletes what a killed writer left in `folder` (``layout.is_debris``); call it only
  while holding the run's lease, so no live writer owns those names.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.commits import (
    DirectoryCommit,
    LocalDirectoryCommit,
    RemoteDirectoryCommit,
    set_upload_hook,
    upload_progress,
)
from prefect_gliner2.session_core.direct_io import open_direct, open_new_file
from prefect_gliner2.session_core.durability import fsync_dir
from prefect_gliner2.session_core.tempcopies import TEMP_PREFIX, clean_stale_temp, process_alive, process_start

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


logger = logging.getLogger(__name__)


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
def open_new_local(path: str | os.PathLike[str], *, direct: bool = False) -> Iterator[Any]:
    """A new local file (refused if it exists; mode 0o600) to stream into; flushed and fsynced on close. `direct`
    writes it around the page cache (``direct_io``)."""
    with open_direct(path) if direct else open_new_file(path) as handle:
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


def directory_commit(
    uri: str,
    marker: str,
    *,
    what: str,
    before_commit: Callable[[], None] | None = None,
    direct: bool = False,
) -> DirectoryCommit:
    """A commit of a new directory at `uri` under this storage's policy; refuses a destination that is not empty,
    except (remote storage) the debris of an interrupted commit: our pending marker and no `marker`.

    `what` names the directory in the error ("checkpoint", "export"); `direct` writes local files streamed into it
    around the page cache (``DirectoryCommit``).
    """
    fs, path = resolve(uri)
    if fs.exists(path) and (not fs.isdir(path) or fs.ls(path)):
        if is_local(fs) or not interrupted_commit(fs, path, marker):
            raise FileExistsError(f"{what} destination {uri} already exists and is not empty; choose a new location")
        logger.warning("replacing the incomplete %s at %s (its upload was interrupted)", what, uri)
        fs.rm(path, recursive=True)
    if not is_local(fs):
        return RemoteDirectoryCommit(fs, path, uri, marker, before_commit)
    commit = LocalDirectoryCommit(fs, path, uri, marker, before_commit)
    commit.direct = direct
    return commit


def interrupted_commit(fs: Any, path: str, marker: str) -> bool:
    """A remote directory holding our pending marker but not `marker`: a commit that was killed mid-upload."""
    return bool(fs.exists(f"{path}/{layout.PENDING_FILE}")) and not fs.exists(f"{path}/{marker}")


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
