"""Reading checkpoints: the index checked, every file's size stat-checked, and files streamed through their hash.

A file is read back through a verifying reader that hashes what it hands out (in helper threads, overlapping the next
read) and raises at the end of the file when size or digest differ. No file is ever held whole in memory.
`open_checkpoint` checks the index and every file's size (stat only); `read_checkpoint` also streams every file
through the hash before returning (for callers that must know a checkpoint is intact before using it).

A checkpoint opened with ``read_once=True`` (a restore: ``load_state``, and the prefetch that feeds it) drops each of
its own local files (not the small index) from the page cache once that file is read: its bytes now live in the
session's tensors, the next checkpoint supersedes it, and a cached copy would only hold memory (on a virtual machine
whose host backs guest pages on first use, the pages freed this way are the cheap ones the first batch after a resume
allocates next). A second restore from the same checkpoint reads it from the disk. Files it references elsewhere
(blobs shared between checkpoints), reads without ``read_once`` (a verification, a warm start) and other stores are
left alone.

`prefetch_checkpoint` starts reading (and verifying) some files of a checkpoint in one background thread while the
caller does other work (a worker builds its model meanwhile); the next `open_checkpoint` of the same checkpoint
hands those results over (`Checkpoint.prefetched`), and a reader of them gets the same data or the same error as a
read in its own thread.
"""

from __future__ import annotations

import concurrent.futures
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from prefect_gliner2.session_core.checkpoint import digest
from prefect_gliner2.session_core.checkpoint.format import (
    INDEX_FILE,
    RESUMABLE_VERSION,
    FileRef,
    check_index,
    entry_scheme,
    load_index,
)
from prefect_gliner2.session_core.errors import CheckpointDamagedError, CheckpointError
from prefect_gliner2.session_core.storage import is_local, resolve

__all__ = [
    "Checkpoint",
    "VerifiedReader",
    "checkpoint_exists",
    "checkpoint_meta",
    "checkpoint_refs",
    "discard_prefetch",
    "open_checkpoint",
    "prefetch_checkpoint",
    "read_checkpoint",
]


class VerifiedReader:
    """A file of a checkpoint, read as a stream: what it hands out is hashed (in helper threads, overlapping the
    next read), and `finish()` (called on a clean exit from `Checkpoint.open`) reads any rest and raises
    CheckpointDamagedError when the size or the digest differ. Buffers filled by `readinto` are hashed in place:
    leave them unchanged until the file is finished (until then their contents are unverified)."""

    def __init__(self, handle: IO[bytes], name: str, entry: dict[str, Any], uri: str) -> None:
        self._handle = handle
        self._entry = entry
        self.name = name
        self.uri = uri
        self._scheme = entry_scheme(entry, f"checkpoint {uri}: {name}")
        self._hash = digest.HashStream(self._scheme, size_hint=self.expected_bytes)

    @property
    def size(self) -> int:
        return self._hash.size

    @property
    def expected_bytes(self) -> int:
        return int(self._entry["bytes"])

    def readinto(self, buffer: Any) -> int:
        """Fill `buffer` completely (a writable buffer); CheckpointError when the file ends first."""
        view = memoryview(buffer).cast("B")
        for start in range(0, len(view), digest.CHUNK_BYTES):
            piece = view[start : start + digest.CHUNK_BYTES]
            filled = 0
            while filled < len(piece):
                got = self._handle.readinto(piece[filled:])  # type: ignore[attr-defined]
                if not got:
                    raise self._truncated(self.size + filled)
                filled += got
            self._hash.add(piece)
        return len(view)

    def read_exact(self, count: int) -> bytes:
        data = bytearray(count)
        self.readinto(data)
        return bytes(data)

    def finish(self) -> None:
        while self.size <= self.expected_bytes:
            rest = self._handle.read(digest.CHUNK_BYTES)
            if not rest:
                break
            self._hash.add(memoryview(rest))
        if self.size != self.expected_bytes:
            raise self._truncated(self.size)
        if self._hash.hexdigest() != self._entry[self._scheme.key]:
            raise CheckpointDamagedError(
                f"checkpoint file {self.name} in {self.uri} does not match its recorded {self._scheme.label}: edited "
                "or corrupted; use an earlier checkpoint"
            )

    def _truncated(self, size: int) -> CheckpointError:
        return CheckpointDamagedError(
            f"checkpoint file {self.name} in {self.uri} has {size} bytes, the index says {self.expected_bytes}: "
            "truncated or replaced; use an earlier checkpoint"
        )


class Checkpoint:
    """A committed checkpoint's index (files, refs, meta) with verified streaming access to its files."""

    def __init__(self, uri: str, fs: Any, path: str, index: dict[str, Any], *, read_once: bool = False) -> None:
        self.uri = uri
        #: Drop each of this checkpoint's own local files from the page cache after reading it (module docstring).
        self.read_once = read_once
        self.meta: dict[str, Any] = index.get("meta", {}) if isinstance(index.get("meta"), dict) else {}
        self.version = int(index["version"])
        self.refs = {name: FileRef.from_dict(v, uri) for name, v in dict(index.get("refs") or {}).items()}
        self._fs = fs
        self._entries: dict[str, tuple[str, dict[str, Any]]] = {
            name: (f"{path}/{name}", entry) for name, entry in sorted(dict(index.get("files") or {}).items())
        }
        for name, ref in self.refs.items():
            self._entries[name] = (posixpath.normpath(f"{path}/{ref.path}"), ref.to_dict())
        self._index = index
        self._prefetched: dict[str, concurrent.futures.Future[Any]] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def has(self, name: str) -> bool:
        return name in self._entries

    def check_sizes(self) -> None:
        """Every listed file exists with its listed size and a digest of a known scheme (a stat each; contents are
        checked while reading)."""
        for name, (file_path, entry) in self._entries.items():
            entry_scheme(entry, f"checkpoint {self.uri}: {name}")
            if not self._fs.exists(file_path):
                raise CheckpointDamagedError(
                    f"checkpoint {self.uri} is missing {name}; restore it from a copy or use an earlier checkpoint"
                )
            size = self._fs.size(file_path)
            if size != entry.get("bytes"):
                raise CheckpointDamagedError(
                    f"checkpoint file {name} in {self.uri} has {size} bytes, the index says {entry.get('bytes')}: "
                    "truncated or replaced; use an earlier checkpoint"
                )

    @contextmanager
    def open(self, name: str) -> Iterator[VerifiedReader]:
        """Stream one file; on a clean exit the rest is read and size and digest are checked (CheckpointError)."""
        file_path, entry = self._entry(name)
        local = is_local(self._fs)
        handle = _open_sequential(file_path) if local else self._fs.open(file_path, "rb")
        with handle:
            reader = VerifiedReader(handle, name, entry, self.uri)
            try:
                yield reader
                reader.finish()
            finally:
                if local and self.read_once and name not in self.refs:
                    _drop_cached(handle)

    def require(self, name: str) -> bytes:
        """A (small) file's verified bytes."""
        with self.open(name) as reader:
            return reader.read_exact(reader.expected_bytes)

    def verify(self) -> None:
        """Stream every file through its hash (bounded memory); CheckpointError at the first difference."""
        self.check_sizes()
        for name in self.names:
            with self.open(name):
                pass

    def prefetch(self, names: Iterable[str], load: Callable[[VerifiedReader], Any]) -> None:
        """Read `names` (those this checkpoint has), one after another in one background thread, each opened with
        `open` and handed to `load`; `prefetched(name)` returns the outcome."""
        wanted = [name for name in names if self.has(name)]
        jobs: dict[str, concurrent.futures.Future[Any]] = {name: concurrent.futures.Future() for name in wanted}

        def read_all() -> None:
            for name, job in jobs.items():
                if not job.set_running_or_notify_cancel():
                    continue
                try:
                    with self.open(name) as reader:
                        result = load(reader)
                except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the file, raised there
                    job.set_exception(exc)
                else:
                    job.set_result(result)

        self._prefetched.update(jobs)
        threading.Thread(target=read_all, name="checkpoint-prefetch", daemon=True).start()

    def prefetched(self, name: str) -> concurrent.futures.Future[Any] | None:
        """The background read of `name` started by `prefetch` (once; None when there is none): `.result()` waits
        for it and returns what `load` returned, or raises what the read raised (e.g. CheckpointDamagedError)."""
        return self._prefetched.pop(name, None)

    def discard_prefetched(self) -> None:
        """Drop the background reads nobody took (those not started are cancelled; a running one finishes and is
        dropped), so their memory is freed."""
        for job in self._prefetched.values():
            job.cancel()
        self._prefetched.clear()

    def _entry(self, name: str) -> tuple[str, dict[str, Any]]:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(
                f"checkpoint {self.uri} has no {name}; it was written by another tool or version"
            ) from None


def _open_sequential(path: str) -> IO[bytes]:
    """A local file opened for one front-to-back read (the kernel is told to read ahead aggressively)."""
    handle = open(path, "rb")  # noqa: SIM115
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return handle


def _drop_cached(handle: IO[bytes]) -> None:
    """Ask the kernel to drop a local file's clean pages from the page cache (a hint: checkpoint files are fsynced
    when written, so every page is clean; pages another process has mapped stay)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def checkpoint_exists(uri: str) -> bool:
    """True when `uri` holds a committed checkpoint index (contents are not verified here)."""
    fs, path = resolve(uri)
    return bool(fs.exists(f"{path.rstrip('/')}/{INDEX_FILE}"))


def checkpoint_meta(uri: str) -> dict[str, Any] | None:
    """The index's `meta` of a committed checkpoint without reading its files (None when there is no index).

    Cheap, for finding and describing checkpoints; `read_checkpoint` still verifies everything before a restore.
    """
    fs, path = resolve(uri)
    index = load_index(fs, path.rstrip("/"), uri)
    if index is None:
        return None
    meta = index.get("meta")
    return meta if isinstance(meta, dict) else {}


def checkpoint_refs(uri: str) -> list[FileRef]:
    """The blob references in the index of the committed checkpoint at `uri` (none without an index); reads the
    index only. CheckpointDamagedError when the index or a reference in it is unreadable."""
    fs, path = resolve(uri)
    index = load_index(fs, path.rstrip("/"), uri)
    if index is None:
        return []
    refs = index.get("refs") or {}
    if not isinstance(refs, dict):
        raise CheckpointDamagedError(f"{uri} has invalid blob references {refs!r}; the index is damaged")
    return [FileRef.from_dict(value, uri) for value in refs.values()]


_pending_lock = threading.Lock()
_pending: Checkpoint | None = None  # the one prefetched checkpoint the next open_checkpoint of its uri takes


def open_checkpoint(uri: str, *, min_version: int = RESUMABLE_VERSION, read_once: bool = False) -> Checkpoint:
    """The checkpoint at `uri` with its index checked and every file's size stat-checked; contents are verified as
    they are read. `min_version` 1 admits format-1 checkpoints (for reading their weights only). `read_once`: each
    of its own local files leaves the page cache once read (a restore; see the module docstring). When
    `prefetch_checkpoint` started reading this checkpoint (the same uri and the same index), the checkpoint returned
    carries those reads (`Checkpoint.prefetched`)."""
    global _pending
    fs, path = resolve(uri)
    path = path.rstrip("/")
    index = load_index(fs, path, uri)
    if index is None:
        hint = " (it holds files but no index: an incomplete write)" if fs.exists(path) else ""
        raise CheckpointError(f"no committed checkpoint at {uri}{hint}; pass the directory a save_state call wrote")
    check_index(index, uri, min_version)
    with _pending_lock:
        pending, _pending = (_pending, None) if _pending is not None and _pending.uri == uri else (None, _pending)
    if pending is not None and pending._index == index:
        pending.check_sizes()
        pending.read_once = pending.read_once or read_once
        return pending
    if pending is not None:
        pending.discard_prefetched()
    checkpoint = Checkpoint(uri, fs, path, index, read_once=read_once)
    checkpoint.check_sizes()
    return checkpoint


def prefetch_checkpoint(
    uri: str, names: Iterable[str], load: Callable[[VerifiedReader], Any], *, read_once: bool = False
) -> None:
    """Start reading the files `names` of the checkpoint at `uri` (those it has) in a background thread, each through
    `load`, for the next `open_checkpoint(uri)` to hand over (one pending prefetch per process: a new one replaces
    an untaken one). The index and sizes are checked here (CheckpointError as `open_checkpoint` raises it).
    `read_once` as for `open_checkpoint`."""
    global _pending
    discard_prefetch()
    checkpoint = open_checkpoint(uri, min_version=1, read_once=read_once)
    checkpoint.prefetch(names, load)
    with _pending_lock:
        replaced, _pending = _pending, checkpoint
    if replaced is not None:
        replaced.discard_prefetched()


def discard_prefetch() -> None:
    """Drop a prefetched checkpoint nobody opened (its reads are cancelled or dropped)."""
    global _pending
    with _pending_lock:
        pending, _pending = _pending, None
    if pending is not None:
        pending.discard_prefetched()


def read_checkpoint(uri: str, *, min_version: int = 1) -> Checkpoint:
    """`open_checkpoint`, then every file streamed through its hash: the checkpoint is known intact on return."""
    checkpoint = open_checkpoint(uri, min_version=min_version)
    checkpoint.verify()
    return checkpoint
