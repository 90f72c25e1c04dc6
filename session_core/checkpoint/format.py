"""The checkpoint format: the index (``checkpoint.json``), its version, file digests and on-disk names (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its digest and size, the format name and version, a small `meta` dict, and `refs`: files kept outside the
directory in a content-addressed store beside it (`../blobs/chunked-sha256-<hex>.<ext>`, named by their digest;
format 2 named them `sha256-<hex>.<ext>`; e.g. best weights shared by many checkpoints; a blob is never rewritten or
deleted while a checkpoint names it). A directory without a valid index is not a checkpoint. File names come from
``layout``.

Digests (per file, in the index entry): format 3 writes a chunked sha256 (`chunked_sha256` with its `chunk_bytes`):
the sha256 of a line naming the scheme, chunk size and file length, followed by the 32-byte sha256 digests of the
file's consecutive `chunk_bytes` pieces in order. The pieces hash independently (see ``digest``), and any changed
byte changes the digest as with a plain sha256. Format-2 entries (`sha256`: the plain sha256 of the file) are still
read and verified.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import CheckpointDamagedError, CheckpointError
from prefect_gliner2.session_core.layout import BLOB_DIR
from prefect_gliner2.session_core.layout import CHECKPOINT_INDEX_FILE as INDEX_FILE

__all__ = [
    "BLOB_DIR",
    "CHUNKED_PREFIX",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_FILE",
    "RESUMABLE_VERSION",
    "FileRef",
    "blob_name",
    "check_file_names",
    "check_index",
    "chunked_header",
    "entry_chunk_bytes",
    "entry_digest",
    "index_bytes",
    "is_blob_name",
    "load_index",
]

FORMAT_NAME = "prefect-gliner2/checkpoint"
#: 2: tensors streamed (optimizer moments as safetensors), best weights referenced from the blob store.
#: 3: files hashed as chunked sha256 (parallel hashing); format-2 checkpoints and blobs are still read.
FORMAT_VERSION = 3
#: The oldest format a session resumes from (format 1 copied best weights into every checkpoint: weights only).
RESUMABLE_VERSION = 2
#: The largest piece size an index entry may declare for its chunked sha256.
MAX_HASH_CHUNK = 1 << 30
CHUNKED_PREFIX = "chunked-sha256"

BLOB_NAME = re.compile(rf"^(sha256|{CHUNKED_PREFIX})-[0-9a-f]{{64}}\.[a-z]+$")


def chunked_header(chunk_bytes: int, size: int) -> bytes:
    """The first line a chunked sha256 hashes: the scheme, the piece size and the file length."""
    return f"{CHUNKED_PREFIX} {chunk_bytes} {size}\n".encode()


def entry_chunk_bytes(entry: Mapping[str, Any], where: str) -> int | None:
    """The chunk size of an index entry's chunked sha256, None for a plain sha256; damaged when it has neither."""
    if "chunked_sha256" in entry:
        chunk = entry.get("chunk_bytes")
        if isinstance(chunk, int) and not isinstance(chunk, bool) and 0 < chunk <= MAX_HASH_CHUNK:
            return chunk
        raise CheckpointDamagedError(f"{where} has an invalid chunk_bytes {chunk!r}; the index is damaged")
    if "sha256" in entry:
        return None
    raise CheckpointDamagedError(f"{where} records no sha256; the index is damaged")


def entry_digest(entry: Mapping[str, Any]) -> Any:
    return entry["chunked_sha256"] if "chunked_sha256" in entry else entry.get("sha256")


def is_blob_name(name: str) -> bool:
    """True for a file name the blob store gives content (`sha256-<hex>.<ext>`, `chunked-sha256-<hex>.<ext>`)."""
    return bool(BLOB_NAME.match(name))


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
        chunk = entry_chunk_bytes(value, f"{where}: blob reference {path}")
        return cls(path, str(entry_digest(value)), int(value.get("bytes", -1)), chunk)


def blob_name(entry: Mapping[str, Any], extension: str) -> str:
    """The content-addressed name of a blob whose (chunked sha256) index entry is `entry`."""
    return f"{CHUNKED_PREFIX}-{entry['chunked_sha256']}.{extension}"


def check_file_names(files: Mapping[str, Any], refs: Mapping[str, Any]) -> None:
    """File names a checkpoint may use: plain names, not hidden, not the index, each given once."""
    for name in [*files, *refs]:
        if not name or "/" in name or name.startswith(".") or name == INDEX_FILE:
            raise CheckpointError(f"invalid checkpoint file name {name!r}")
    if set(files) & set(refs):
        raise CheckpointError(f"checkpoint files {sorted(set(files) & set(refs))} are given both inline and as refs")


def index_bytes(entries: Mapping[str, Any], refs: Mapping[str, FileRef], meta: dict[str, Any]) -> bytes:
    """The index of a checkpoint with these file entries, blob references and meta, as written (format 3)."""
    index = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "files": dict(sorted(entries.items())),
        "refs": {name: ref.to_dict() for name, ref in sorted(refs.items())},
        "meta": meta,
    }
    return json.dumps(index, sort_keys=True, indent=1).encode()


def load_index(fs: Any, path: str, uri: str) -> dict[str, Any] | None:
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


def check_index(index: Mapping[str, Any], uri: str, min_version: int) -> None:
    """The index names this format at a version this installation reads, and at least `min_version`."""
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
