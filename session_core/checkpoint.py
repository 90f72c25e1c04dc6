"""Atomic, hash-verified checkpoint directories on any fsspec storage, written and read as streams (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its sha256 and size, the format name and version, a small `meta` dict, and `refs`: files kept outside the
directory in a content-addressed store beside it (`../blobs/sha256-<hex>.<ext>`, e.g. best weights shared by many
checkpoints; a blob is never rewritten or deleted while a checkpoint names it). A directory without a valid index
is not a checkpoint. Writing is a ``storage.directory_commit`` with the index as its marker: on local storage the
files are staged in a hidden sibling directory, fsynced, and renamed into place, so a kill at any moment leaves
either nothing or a complete checkpoint; on object stores the index is the commit marker. File names come from
``layout``.

Streaming: a file is produced by a writer callable into a hashing stream (the sha256 is computed in the same pass
as the write, chunk by chunk, overlapped in a helper thread), and read back through a verifying reader that hashes
what it hands out and raises at the end of the file when size or hash differ. No file is ever held whole in memory.
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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from . import layout
from .errors import CheckpointDamagedError, CheckpointError
from .layout import BLOB_DIR
from .layout import CHECKPOINT_INDEX_FILE as INDEX_FILE
from .storage import directory_commit, fsync_dir, is_local, open_new_local, resolve

FORMAT_NAME = "prefect-gliner2/checkpoint"
#: 2: tensors streamed (optimizer moments as safetensors), best weights referenced from the blob store.
FORMAT_VERSION = 2
CHUNK_BYTES = 8 << 20

__all__ = [
    "BLOB_DIR",
    "FORMAT_VERSION",
    "Checkpoint",
    "FileRef",
    "Payload",
    "VerifiedReader",
    "checkpoint_exists",
    "checkpoint_meta",
    "checkpoint_refs",
    "open_checkpoint",
    "read_checkpoint",
    "store_blob",
    "write_checkpoint",
]

_REF_PATH = re.compile(rf"^\.\./{BLOB_DIR}/sha256-[0-9a-f]{{64}}\.[a-z]+$")

#: A checkpoint file: its bytes, or a callable that writes them into the (hashing) stream it is given.
Payload = bytes | Callable[[IO[bytes]], None]

_hasher: concurrent.futures.ThreadPoolExecutor | None = None


def _hash_thread() -> concurrent.futures.ThreadPoolExecutor:
    global _hasher
    if _hasher is None:
        _hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-sha256")
    return _hasher


@dataclass(frozen=True)
class FileRef:
    """A file outside the checkpoint directory, by its path relative to the directory, sha256 and size."""

    path: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, value: Any, where: str) -> FileRef:
        if not isinstance(value, dict) or not _REF_PATH.match(str(value.get("path"))):
            raise CheckpointDamagedError(f"{where} has an invalid blob reference {value!r}; the index is damaged")
        return cls(str(value["path"]), str(value.get("sha256")), int(value.get("bytes", -1)))


# ---- writing -------------------------------------------------------------------------------------------------------


class _HashingWriter:
    """A write-only stream that hashes and counts what passes through, the hash overlapping the write."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            hashed = _hash_thread().submit(self._sha.update, chunk)  # hashlib releases the GIL on big buffers
            self._handle.write(chunk)
            hashed.result()
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self._handle.flush()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _emit(handle: IO[bytes], payload: Payload) -> dict[str, Any]:
    writer = _HashingWriter(handle)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        writer.write(payload)
    else:
        payload(writer)  # type: ignore[arg-type]
    return {"sha256": writer.hexdigest(), "bytes": writer.size}


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
    """Write `payload` once into the content-addressed store beside `checkpoint_uri` (`../blobs/sha256-<hex>.<ext>`)
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
            final = os.path.join(store, f"sha256-{entry['sha256']}.{extension}")
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
        fs.mv(temp, f"{store}/sha256-{entry['sha256']}.{extension}")
    return FileRef(f"../{BLOB_DIR}/sha256-{entry['sha256']}.{extension}", entry["sha256"], entry["bytes"])


# ---- reading -------------------------------------------------------------------------------------------------------


class VerifiedReader:
    """A file of a checkpoint, read as a stream: what it hands out is hashed, and `finish()` (called on a clean
    exit from `Checkpoint.open`) reads any rest and raises CheckpointError when the size or the sha256 differ."""

    def __init__(self, handle: IO[bytes], name: str, entry: dict[str, Any], uri: str) -> None:
        self._handle = handle
        self._sha = hashlib.sha256()
        self._entry = entry
        self.name = name
        self.uri = uri
        self.size = 0

    @property
    def expected_bytes(self) -> int:
        return int(self._entry["bytes"])

    def readinto(self, buffer: Any) -> int:
        """Fill `buffer` completely (a writable buffer); CheckpointError when the file ends first."""
        view = memoryview(buffer).cast("B")
        hashed: concurrent.futures.Future[None] | None = None
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            filled = 0
            while filled < len(chunk):
                got = self._handle.readinto(chunk[filled:])  # type: ignore[attr-defined]
                if not got:
                    raise self._truncated(self.size + start + filled)
                filled += got
            if hashed is not None:
                hashed.result()
            hashed = _hash_thread().submit(self._sha.update, chunk)  # overlaps the next read
        if hashed is not None:
            hashed.result()
        self.size += len(view)
        return len(view)

    def read_exact(self, count: int) -> bytes:
        data = bytearray(count)
        self.readinto(data)
        return bytes(data)

    def finish(self) -> None:
        while True:
            rest = self._handle.read(CHUNK_BYTES)
            if not rest:
                break
            self._sha.update(rest)
            self.size += len(rest)
        if self.size != self.expected_bytes:
            raise self._truncated(self.size)
        if self._sha.hexdigest() != self._entry.get("sha256"):
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
        handle = open(file_path, "rb") if is_local(self._fs) else self._fs.open(file_path, "rb")  # noqa: SIM115
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


def open_checkpoint(uri: str, *, min_version: int = FORMAT_VERSION) -> Checkpoint:
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
