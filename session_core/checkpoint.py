"""Atomic, hash-verified checkpoint directories on any fsspec storage, written and read as streams (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its digest (see Hashes below) and size, the format name and version, a small `meta` dict, and `refs`: files
kept outside the directory in a content-addressed store beside it (`../blobs/chunked-sha256-<hex>.<ext>`, named by
their digest; format 2 named them `sha256-<hex>.<ext>`; e.g. best weights shared by many checkpoints; a blob is
never rewritten or deleted while a checkpoint names it). A directory without a valid index
is not a checkpoint. Writing is a ``storage.directory_commit`` with the index as its marker: on local storage the
files are staged in a hidden sibling directory, fsynced, and renamed into place, so a kill at any moment leaves
either nothing or a complete checkpoint; on object stores the index is the commit marker. File names come from
``layout``.

Streaming: a file is produced by a writer callable into a hashing stream (the hash is computed in the same pass as
the write, overlapped with it in helper threads), and read back through a verifying reader that hashes what it hands
out and raises at the end of the file when size or hash differ. No file is ever held whole in memory.

Hashes (per file, in the index entry): format 3 writes a chunked sha256 (`chunked_sha256` with its `chunk_bytes`):
the sha256 of a line naming the scheme, chunk size and file length, followed by the 32-byte sha256 digests of the
file's consecutive `chunk_bytes` pieces in order. The pieces hash independently, so several threads hash them while
the file is written or read (hashlib releases the GIL), and any changed byte changes the digest as with a plain
sha256. Format-2 entries (`sha256`: the plain sha256 of the file) are still read and verified, in one helper thread.
`open_checkpoint` checks the index and every file's size (stat only); `read_checkpoint` also streams every file
through the hash before returning (for callers that must know a checkpoint is intact before using it).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import posixpath
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.errors import CheckpointDamagedError, CheckpointError
from prefect_gliner2.session_core.layout import BLOB_DIR
from prefect_gliner2.session_core.layout import CHECKPOINT_INDEX_FILE as INDEX_FILE
from prefect_gliner2.session_core.storage import directory_commit, fsync_dir, is_local, open_new_local, resolve

FORMAT_NAME = "prefect-gliner2/checkpoint"
#: 2: tensors streamed (optimizer moments as safetensors), best weights referenced from the blob store.
#: 3: files hashed as chunked sha256 (parallel hashing); format-2 checkpoints and blobs are still read.
FORMAT_VERSION = 3
#: The oldest format a session resumes from (format 1 copied best weights into every checkpoint: weights only).
RESUMABLE_VERSION = 2
#: Bytes per read or write call and per piece handed to the hash (bounded buffers, hashing overlapped with I/O).
CHUNK_BYTES = 8 << 20
#: Piece size of the chunked sha256 written into new indexes (each entry records its own; readers use that one).
HASH_CHUNK_BYTES = 8 << 20
#: Threads hashing pieces in parallel (at most this many times two, plus two, pieces wait to be hashed): the CPUs
#: this process may use, at most 8; a session worker sets it to its slot's ``cpu_threads`` (``set_hash_threads``).
HASH_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
_MAX_HASH_CHUNK = 1 << 30
#: Written pieces shorter than this are copied before hashing (a caller may reuse a small buffer at once).
_COPY_BELOW = 1 << 20
_CHUNKED_PREFIX = "chunked-sha256"

__all__ = [
    "BLOB_DIR",
    "FORMAT_VERSION",
    "RESUMABLE_VERSION",
    "Checkpoint",
    "FileRef",
    "Payload",
    "VerifiedReader",
    "checkpoint_exists",
    "checkpoint_meta",
    "checkpoint_refs",
    "is_blob_name",
    "open_checkpoint",
    "read_checkpoint",
    "set_hash_threads",
    "store_blob",
    "write_checkpoint",
]

_BLOB_NAME = re.compile(rf"^(sha256|{_CHUNKED_PREFIX})-[0-9a-f]{{64}}\.[a-z]+$")

#: A checkpoint file: its bytes, or a callable that writes them into the (hashing) stream it is given.
Payload = bytes | Callable[[IO[bytes]], None]

_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The shared hashing pool with `threads` threads (1: in submission order, for plain sha256 streams)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="checkpoint-hash")
            _pools[threads] = pool
        return pool


def _forget_pools() -> None:
    global _pools_lock
    _pools.clear()  # a forked child has none of the parent's threads, and maybe a lock one of them held
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def set_hash_threads(threads: int) -> None:
    """Hash with at most `threads` threads in this process (capped at 8), e.g. a worker slot's CPU share, so
    checkpoint hashing never uses more CPUs than the training it belongs to."""
    global HASH_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CheckpointError(f"hash threads must be a positive int, got {threads!r}")
    HASH_THREADS = min(8, threads)


def _pieces_digest(pieces: list[memoryview]) -> bytes:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.digest()


class _HashStream:
    """The hash of a byte stream fed in order, computed in helper threads while the caller does the I/O.

    `chunk_bytes` None: the plain sha256 (format-2 entries), updated in order by one thread. Otherwise the chunked
    sha256 (see the module docstring): each completed piece is hashed by the next free thread. Buffers given to
    `add` are hashed later: they must stay unchanged until `hexdigest` returns. At most ``2 * HASH_THREADS + 2``
    hash jobs are pending; `add` waits for the oldest beyond that (bounded memory when buffers are temporary)."""

    def __init__(self, chunk_bytes: int | None) -> None:
        self._chunk = chunk_bytes
        self._plain = hashlib.sha256() if chunk_bytes is None else None
        self._pieces: list[memoryview] = []
        self._filled = 0
        self.size = 0
        self._jobs: list[concurrent.futures.Future[Any]] = []
        self._settled = 0

    def add(self, view: memoryview) -> None:
        self.size += len(view)
        if self._plain is not None:
            self._submit(_pool(1), self._plain.update, view)
            return
        assert self._chunk is not None
        while len(view):
            take = min(len(view), self._chunk - self._filled)
            self._pieces.append(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self._chunk:
                self._seal()

    def hexdigest(self) -> str:
        if self._plain is not None:
            for job in self._jobs[self._settled :]:
                job.result()
            return self._plain.hexdigest()
        if self._pieces:
            self._seal()
        digests = b"".join(job.result() for job in self._jobs)
        return hashlib.sha256(_chunked_header(self._chunk or 0, self.size) + digests).hexdigest()

    def _seal(self) -> None:
        pieces, self._pieces, self._filled = self._pieces, [], 0
        self._submit(_pool(HASH_THREADS), _pieces_digest, pieces)

    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, job: Callable[[Any], Any], arg: Any) -> None:
        self._jobs.append(pool.submit(job, arg))
        while len(self._jobs) - self._settled > 2 * HASH_THREADS + 2:
            self._jobs[self._settled].result()
            self._settled += 1


def _chunked_header(chunk_bytes: int, size: int) -> bytes:
    return f"{_CHUNKED_PREFIX} {chunk_bytes} {size}\n".encode()


def _entry_chunk_bytes(entry: Mapping[str, Any], where: str) -> int | None:
    """The chunk size of an index entry's chunked sha256, None for a plain sha256; damaged when it has neither."""
    if "chunked_sha256" in entry:
        chunk = entry.get("chunk_bytes")
        if isinstance(chunk, int) and not isinstance(chunk, bool) and 0 < chunk <= _MAX_HASH_CHUNK:
            return chunk
        raise CheckpointDamagedError(f"{where} has an invalid chunk_bytes {chunk!r}; the index is damaged")
    if "sha256" in entry:
        return None
    raise CheckpointDamagedError(f"{where} records no sha256; the index is damaged")


def _entry_digest(entry: Mapping[str, Any]) -> Any:
    return entry["chunked_sha256"] if "chunked_sha256" in entry else entry.get("sha256")


def is_blob_name(name: str) -> bool:
    """True for a file name the blob store gives content (`sha256-<hex>.<ext>`, `chunked-sha256-<hex>.<ext>`)."""
    return bool(_BLOB_NAME.match(name))


@dataclass(frozen=True)
class FileRef:
    """A file outside the checkpoint directory: its path relative to the directory, digest and size; `chunk_bytes`
    is the piece size of a chunked sha256 digest, None for a plain sha256 (blobs written by format 2)."""

    path: str
    digest: str
    bytes: int
    chunk_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.chunk_bytes is None:
            return {"path": self.path, "sha256": self.digest, "bytes": self.bytes}
        return {"path": self.path, "chunked_sha256": self.digest, "chunk_bytes": self.chunk_bytes, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, value: Any, where: str) -> FileRef:
        path = str(value.get("path")) if isinstance(value, dict) else ""
        prefix = f"../{BLOB_DIR}/"
        if not path.startswith(prefix) or not is_blob_name(path[len(prefix) :]):
            raise CheckpointDamagedError(f"{where} has an invalid blob reference {value!r}; the index is damaged")
        chunk = _entry_chunk_bytes(value, f"{where}: blob reference {path}")
        return cls(path, str(_entry_digest(value)), int(value.get("bytes", -1)), chunk)


# ---- writing -------------------------------------------------------------------------------------------------------


class _HashingWriter:
    """A write-only stream that hashes (chunked sha256) and counts what passes through, the hash overlapping the
    write. Buffers of 1 MiB and more are hashed in place: they must stay unchanged until the payload returns."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._hash = _HashStream(HASH_CHUNK_BYTES)
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) < _COPY_BELOW:
            view = memoryview(bytes(view))
        for start in range(0, len(view), CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
            self._hash.add(piece)  # hashed by the pool while the write below copies it out
            self._handle.write(piece)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self._handle.flush()

    def entry(self) -> dict[str, Any]:
        return {"chunked_sha256": self._hash.hexdigest(), "chunk_bytes": HASH_CHUNK_BYTES, "bytes": self.size}


def _emit(handle: IO[bytes], payload: Payload) -> dict[str, Any]:
    writer = _HashingWriter(handle)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        writer.write(payload)
    else:
        payload(writer)  # type: ignore[arg-type]
    return writer.entry()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_checkpoint(
    uri: str,
    files: Mapping[str, Payload],
    meta: dict[str, Any],
    refs: Mapping[str, FileRef] | None = None,
    *,
    before_commit: Callable[[], None] | None = None,
) -> str:
    """Write `files` (streamed, hashed in the same pass) and the index atomically to `uri` (which must not exist
    yet); `refs` name blobs already in the store beside it. Returns the index sha256.

    `before_commit` runs when every file but the index is in place (tests use it to kill a writer there)."""
    refs = dict(refs or {})
    for name in [*files, *refs]:
        if not name or "/" in name or name.startswith(".") or name == INDEX_FILE:
            raise CheckpointError(f"invalid checkpoint file name {name!r}")
    if set(files) & set(refs):
        raise CheckpointError(f"checkpoint files {sorted(set(files) & set(refs))} are given both inline and as refs")
    fs, path = resolve(uri)
    for name, ref in refs.items():
        target = posixpath.normpath(f"{path}/{ref.path}")
        if not fs.exists(target) or fs.size(target) != ref.bytes:
            raise CheckpointError(f"blob {ref.path} for {name} is missing or has the wrong size; store it first")
    try:
        commit = directory_commit(uri, INDEX_FILE, what="checkpoint", before_commit=before_commit)
    except FileExistsError:
        raise CheckpointError(
            f"checkpoint destination {uri} already exists; checkpoints are immutable, choose a new location"
        ) from None
    entries: dict[str, Any] = {}
    with commit:
        for name, payload in files.items():
            with commit.open(name) as handle:
                entries[name] = _emit(handle, payload)
        index = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "files": dict(sorted(entries.items())),
            "refs": {name: ref.to_dict() for name, ref in sorted(refs.items())},
            "meta": meta,
        }
        data = json.dumps(index, sort_keys=True, indent=1).encode()
        commit.commit(data)
    return _sha256(data)


def store_blob(checkpoint_uri: str, payload: Payload, extension: str) -> FileRef:
    """Write `payload` once into the content-addressed store beside `checkpoint_uri`
    (`../blobs/chunked-sha256-<hex>.<ext>`)
    and return the reference a checkpoint index records. Same content, same name: storing twice keeps one file."""
    if not re.fullmatch(r"[a-z]+", extension):
        raise CheckpointError(f"invalid blob extension {extension!r}")
    fs, path = resolve(checkpoint_uri)
    parent = posixpath.dirname(path)
    store = f"{parent}/{BLOB_DIR}"
    temp_name = layout.staging_name("blob")
    if is_local(fs):
        os.makedirs(store, mode=0o700, exist_ok=True)
        temp = os.path.join(parent, temp_name)  # beside the checkpoints: debris cleaning finds it after a kill
        try:
            with open_new_local(temp) as handle:
                entry = _emit(handle, payload)
            final = os.path.join(store, _blob_name(entry, extension))
            os.replace(temp, final)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        fsync_dir(store)
    else:
        fs.makedirs(store, exist_ok=True)
        temp = f"{store}/{temp_name}"
        with fs.open(temp, "wb") as handle:
            entry = _emit(handle, payload)
        fs.mv(temp, f"{store}/{_blob_name(entry, extension)}")
    return FileRef.from_dict({**entry, "path": f"../{BLOB_DIR}/{_blob_name(entry, extension)}"}, checkpoint_uri)


def _blob_name(entry: dict[str, Any], extension: str) -> str:
    return f"{_CHUNKED_PREFIX}-{entry['chunked_sha256']}.{extension}"


# ---- reading -------------------------------------------------------------------------------------------------------


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
        self._hash = _HashStream(_entry_chunk_bytes(entry, f"checkpoint {uri}: {name}"))

    @property
    def size(self) -> int:
        return self._hash.size

    @property
    def expected_bytes(self) -> int:
        return int(self._entry["bytes"])

    def readinto(self, buffer: Any) -> int:
        """Fill `buffer` completely (a writable buffer); CheckpointError when the file ends first."""
        view = memoryview(buffer).cast("B")
        for start in range(0, len(view), CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
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
            rest = self._handle.read(CHUNK_BYTES)
            if not rest:
                break
            self._hash.add(memoryview(rest))
        if self.size != self.expected_bytes:
            raise self._truncated(self.size)
        if self._hash.hexdigest() != _entry_digest(self._entry):
            raise CheckpointDamagedError(
                f"checkpoint file {self.name} in {self.uri} does not match its recorded sha256: edited or corrupted; "
                "use an earlier checkpoint"
            )

    def _truncated(self, size: int) -> CheckpointError:
        return CheckpointDamagedError(
            f"checkpoint file {self.name} in {self.uri} has {size} bytes, the index says {self.expected_bytes}: "
            "truncated or replaced; use an earlier checkpoint"
        )


class Checkpoint:
    """A committed checkpoint's index (files, refs, meta) with verified streaming access to its files."""

    def __init__(self, uri: str, fs: Any, path: str, index: dict[str, Any]) -> None:
        self.uri = uri
        self.meta: dict[str, Any] = index.get("meta", {}) if isinstance(index.get("meta"), dict) else {}
        self.version = int(index["version"])
        self.refs = {name: FileRef.from_dict(v, uri) for name, v in dict(index.get("refs") or {}).items()}
        self._fs = fs
        self._entries: dict[str, tuple[str, dict[str, Any]]] = {
            name: (f"{path}/{name}", entry) for name, entry in sorted(dict(index.get("files") or {}).items())
        }
        for name, ref in self.refs.items():
            self._entries[name] = (posixpath.normpath(f"{path}/{ref.path}"), ref.to_dict())

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def has(self, name: str) -> bool:
        return name in self._entries

    def check_sizes(self) -> None:
        """Every listed file exists with its listed size (a stat each; contents are checked while reading)."""
        for name, (file_path, entry) in self._entries.items():
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
        """Stream one file; on a clean exit the rest is read and size and sha256 are checked (CheckpointError)."""
        file_path, entry = self._entry(name)
        handle = _open_sequential(file_path) if is_local(self._fs) else self._fs.open(file_path, "rb")
        with handle:
            reader = VerifiedReader(handle, name, entry, self.uri)
            yield reader
            reader.finish()

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


def checkpoint_exists(uri: str) -> bool:
    """True when `uri` holds a committed checkpoint index (contents are not verified here)."""
    fs, path = resolve(uri)
    return bool(fs.exists(f"{path.rstrip('/')}/{INDEX_FILE}"))


def _load_index(fs: Any, path: str, uri: str) -> dict[str, Any] | None:
    index_path = f"{path}/{INDEX_FILE}"
    if not fs.exists(index_path):
        return None
    try:
        index = json.loads(fs.cat_file(index_path))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointDamagedError(
            f"checkpoint index {index_path} is not valid JSON ({exc}); the checkpoint is damaged"
        ) from exc
    if not isinstance(index, dict):
        raise CheckpointDamagedError(f"checkpoint index {index_path} is not a JSON object; the checkpoint is damaged")
    return index


def checkpoint_meta(uri: str) -> dict[str, Any] | None:
    """The index's `meta` of a committed checkpoint without reading its files (None when there is no index).

    Cheap, for finding and describing checkpoints; `read_checkpoint` still verifies everything before a restore.
    """
    fs, path = resolve(uri)
    index = _load_index(fs, path.rstrip("/"), uri)
    if index is None:
        return None
    meta = index.get("meta")
    return meta if isinstance(meta, dict) else {}


def checkpoint_refs(uri: str) -> list[FileRef]:
    """The blob references in the index of the committed checkpoint at `uri` (none without an index); reads the
    index only. CheckpointDamagedError when the index or a reference in it is unreadable."""
    fs, path = resolve(uri)
    index = _load_index(fs, path.rstrip("/"), uri)
    if index is None:
        return []
    refs = index.get("refs") or {}
    if not isinstance(refs, dict):
        raise CheckpointDamagedError(f"{uri} has invalid blob references {refs!r}; the index is damaged")
    return [FileRef.from_dict(value, uri) for value in refs.values()]


def open_checkpoint(uri: str, *, min_version: int = RESUMABLE_VERSION) -> Checkpoint:
    """The checkpoint at `uri` with its index checked and every file's size stat-checked; contents are verified as
    they are read. `min_version` 1 admits format-1 checkpoints (for reading their weights only)."""
    fs, path = resolve(uri)
    path = path.rstrip("/")
    index = _load_index(fs, path, uri)
    if index is None:
        hint = " (it holds files but no index: an incomplete write)" if fs.exists(path) else ""
        raise CheckpointError(f"no committed checkpoint at {uri}{hint}; pass the directory a save_state call wrote")
    if index.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{uri} is not a prefect-gliner2 checkpoint (format {index.get('format')!r})")
    version = index.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {uri} has format version {version!r}, newer than this installation reads "
            f"({FORMAT_VERSION}); upgrade prefect-gliner2"
        )
    if version < min_version:
        raise CheckpointError(
            f"checkpoint {uri} has format version {version}, written by an earlier prefect-gliner2 (whole-file "
            f"tensors, best weights copied into every checkpoint); this installation resumes format {min_version} "
            "only. Finish that run with the earlier version, or start a new run from its weights with load_weights"
        )
    checkpoint = Checkpoint(uri, fs, path, index)
    checkpoint.check_sizes()
    return checkpoint


def read_checkpoint(uri: str, *, min_version: int = 1) -> Checkpoint:
    """`open_checkpoint`, then every file streamed through its hash: the checkpoint is known intact on return."""
    checkpoint = open_checkpoint(uri, min_version=min_version)
    checkpoint.verify()
    return checkpoint
