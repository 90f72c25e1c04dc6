"""Writing checkpoints: files streamed through their hash into an atomic directory commit, and the blob store.

Writing is a ``storage.directory_commit`` with the index as its marker: on local storage the files are staged in a
hidden sibling directory, fsynced, and renamed into place, so a kill at any moment leaves either nothing or a
complete checkpoint; on object stores the index is the commit marker. A file is produced by a writer callable into
a hashing stream (the digest is computed in the same pass, overlapped with the write); no file is held whole.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import IO, Any

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import digest
from prefect_gliner2.session_core.checkpoint.format import (
    BLAKE3,
    BLOB_DIR,
    INDEX_FILE,
    FileRef,
    blob_name,
    check_file_names,
    index_bytes,
)
from prefect_gliner2.session_core.errors import CheckpointError
from prefect_gliner2.session_core.storage import directory_commit, fsync_dir, is_local, open_new_local, resolve

__all__ = ["Payload", "payload_entry", "store_blob", "write_checkpoint"]

#: Written pieces shorter than this are gathered into one buffer of this size before they are hashed and written
#: (a caller may reuse a small buffer at once; one hash call and one write per MiB instead of one per tensor).
_GATHER_BELOW = 1 << 20

#: A checkpoint file: its bytes, or a callable that writes them into the (hashing) stream it is given.
Payload = bytes | Callable[[IO[bytes]], None]


class _HashingWriter:
    """A write-only stream that hashes (BLAKE3) and counts what passes through, the hash overlapping the write.
    Small pieces are gathered (copied) first; buffers of 1 MiB and more are hashed in place: they must stay
    unchanged until the payload returns. A file that ends up smaller than ``digest.MULTITHREAD_FROM`` is hashed
    in one thread (no thread start-up for the many small files of a checkpoint)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._hash: digest.HashStream | None = None
        self._gathered = bytearray()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) < _GATHER_BELOW:
            self._gathered += view
            if len(self._gathered) >= _GATHER_BELOW:
                self._drain(final=False)
        else:
            self._drain(final=False)
            self._out(view, final=False)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self._drain(final=False)
        self._handle.flush()

    def entry(self) -> dict[str, Any]:
        self._drain(final=True)
        if self._hash is None:
            self._hash = digest.HashStream(BLAKE3, size_hint=0)  # an empty file
        return {BLAKE3.key: self._hash.hexdigest(), "bytes": self.size}

    def _drain(self, *, final: bool) -> None:
        if self._gathered:
            gathered, self._gathered = self._gathered, bytearray()  # a new buffer: the old one may still be hashed
            self._out(memoryview(gathered), final=final)

    def _out(self, view: memoryview, *, final: bool) -> None:
        if self._hash is None:  # the whole file is this view when it is also the last one
            self._hash = digest.HashStream(BLAKE3, size_hint=len(view) if final else None)
        for start in range(0, len(view), digest.CHUNK_BYTES):
            piece = view[start : start + digest.CHUNK_BYTES]
            self._hash.add(piece)  # hashed in a helper thread while the write below copies it out
            self._handle.write(piece)


def _emit(handle: IO[bytes], payload: Payload) -> dict[str, Any]:
    writer = _HashingWriter(handle)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        writer.write(payload)
    else:
        payload(writer)  # type: ignore[arg-type]
    return writer.entry()


class _Discard:
    """A stream that keeps nothing (``payload_entry``)."""

    def write(self, data: Any) -> int:
        return len(memoryview(data))

    def flush(self) -> None:
        pass


def payload_entry(payload: Payload) -> dict[str, Any]:
    """The index entry (digest and size) `payload` would get in a checkpoint, computed without writing it: the
    same stream and hash a checkpoint's file goes through, its bytes discarded."""
    return _emit(_Discard(), payload)  # type: ignore[arg-type]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_checkpoint(
    uri: str,
    files: Mapping[str, Payload],
    meta: dict[str, Any],
    refs: Mapping[str, FileRef] | None = None,
    *,
    before_commit: Callable[[], None] | None = None,
    direct: bool = False,
) -> str:
    """Write `files` (streamed, hashed in the same pass) and the index atomically to `uri` (which must not exist
    yet); `refs` name blobs already in the store beside it. Returns the index sha256.

    `before_commit` runs when every file but the index is in place (tests use it to kill a writer there). `direct`
    writes local files around the page cache (``direct_io``): for a checkpoint nobody reads back soon."""
    refs = dict(refs or {})
    check_file_names(files, refs)
    fs, path = resolve(uri)
    for name, ref in refs.items():
        target = posixpath.normpath(f"{path}/{ref.path}")
        if not fs.exists(target) or fs.size(target) != ref.bytes:
            raise CheckpointError(f"blob {ref.path} for {name} is missing or has the wrong size; store it first")
    try:
        commit = directory_commit(uri, INDEX_FILE, what="checkpoint", before_commit=before_commit, direct=direct)
    except FileExistsError:
        raise CheckpointError(
            f"checkpoint destination {uri} already exists; checkpoints are immutable, choose a new location"
        ) from None
    entries: dict[str, Any] = {}
    with commit:
        for name, payload in files.items():
            with commit.open(name) as handle:
                entries[name] = _emit(handle, payload)
        data = index_bytes(entries, refs, meta)
        commit.commit(data)
    return _sha256(data)


def store_blob(checkpoint_uri: str, payload: Payload, extension: str, *, direct: bool = False) -> FileRef:
    """Write `payload` once into the content-addressed store beside `checkpoint_uri` (`../blobs/blake3-<hex>.<ext>`)
    and return the reference a checkpoint index records. Same content, same name: storing twice keeps one file.
    `direct`: as for ``write_checkpoint``."""
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
            with open_new_local(temp, direct=direct) as handle:
                entry = _emit(handle, payload)
            final = os.path.join(store, blob_name(entry, extension))
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
        fs.mv(temp, f"{store}/{blob_name(entry, extension)}")
    return FileRef.from_dict({**entry, "path": f"../{BLOB_DIR}/{blob_name(entry, extension)}"}, checkpoint_uri)
