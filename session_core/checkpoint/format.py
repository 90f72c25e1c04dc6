"""The checkpoint format: the index (``checkpoint.json``), its version, file digests and on-disk names (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its digest and size, the format name and version, a small `meta` dict, and `refs`: files kept outside the
directory in a content-addressed store beside it (`../blobs/<scheme>-<hex>.<ext>`, named by their digest, e.g.
`blake3-<hex>.safetensors`; e.g. best weights shared by many checkpoints; a blob is never rewritten or deleted while
a checkpoint names it). A directory without a valid index is not a checkpoint. File names come from ``layout``.

Digests (per file, in the index entry, one key naming the scheme):

- format 4 writes `blake3`: the BLAKE3 hash (32 bytes, hex) of the whole file. BLAKE3 is a tree hash: one file's
  hash is computed by several threads at once (see ``digest``), several times faster than sha256 per thread.
- format 3 wrote `chunked_sha256` with its `chunk_bytes`: the sha256 of a line naming the scheme, chunk size and
  file length, followed by the 32-byte sha256 digests of the file's consecutive `chunk_bytes` pieces in order.
- format 2 wrote `sha256`: the plain sha256 of the file.

Every scheme is still read and verified (and a format-4 index may refer to a blob an older format stored); any
changed byte changes each of them.
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
    "BLAKE3",
    "BLOB_DIR",
    "CHUNKED_PREFIX",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_FILE",
    "RESUMABLE_VERSION",
    "SHA256",
    "DigestScheme",
    "FileRef",
    "blob_name",
    "check_file_names",
    "check_index",
    "chunked_header",
    "entry_scheme",
    "index_bytes",
    "is_blob_name",
    "load_index",
]

FORMAT_NAME = "prefect-gliner2/checkpoint"
#: 2: tensors streamed (optimizer moments as safetensors), best weights referenced from the blob store.
#: 3: files hashed as chunked sha256 (parallel hashing).
#: 4: files hashed with BLAKE3 (multithreaded, several times faster); formats 2 and 3 are still read.
FORMAT_VERSION = 4
#: The oldest format a session resumes from (format 1 copied best weights into every checkpoint: weights only).
RESUMABLE_VERSION = 2
#: The largest piece size an index entry may declare for its chunked sha256.
MAX_HASH_CHUNK = 1 << 30
CHUNKED_PREFIX = "chunked-sha256"

BLOB_NAME = re.compile(rf"^(blake3|sha256|{CHUNKED_PREFIX})-[0-9a-f]{{64}}\.[a-z]+$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class DigestScheme:
    """How a file's digest is computed: `key` is its index-entry key (and, with `_` as `-`, its blob-name prefix);
    `chunk_bytes` is the piece size of a chunked sha256, None for the other schemes."""

    key: str
    chunk_bytes: int | None = None

    @property
    def label(self) -> str:
        """The scheme as error messages name it."""
        return self.key.replace("_", " ")


#: The scheme new checkpoints and blobs use (format 4).
BLAKE3 = DigestScheme("blake3")
#: The plain sha256 of format 2.
SHA256 = DigestScheme("sha256")


def chunked_header(chunk_bytes: int, size: int) -> bytes:
    """The first line a chunked sha256 hashes: the scheme, the piece size and the file length."""
    return f"{CHUNKED_PREFIX} {chunk_bytes} {size}\n".encode()


def entry_scheme(entry: Mapping[str, Any], where: str) -> DigestScheme:
    """The digest scheme of an index entry (its digest checked to be 64 hex digits); damaged when it has none."""
    if "blake3" in entry:
        scheme = BLAKE3
    elif "chunked_sha256" in entry:
        chunk = entry.get("chunk_bytes")
        if not (isinstance(chunk, int) and not isinstance(chunk, bool) and 0 < chunk <= MAX_HASH_CHUNK):
            raise CheckpointDamagedError(f"{where} has an invalid chunk_bytes {chunk!r}; the index is damaged")
        scheme = DigestScheme("chunked_sha256", chunk)
    elif "sha256" in entry:
        scheme = SHA256
    else:
        raise CheckpointDamagedError(f"{where} records no digest (blake3 or sha256); the index is damaged")
    if not isinstance(entry[scheme.key], str) or not _HEX64.match(entry[scheme.key]):
        raise CheckpointDamagedError(
            f"{where} has an invalid {scheme.label} {entry[scheme.key]!r}; the index is damaged"
        )
    return scheme


def is_blob_name(name: str) -> bool:
    """True for a file name the blob store gives content (`blake3-<hex>.<ext>`, or the older `sha256-<hex>.<ext>`,
    `chunked-sha256-<hex>.<ext>`)."""
    return bool(BLOB_NAME.match(name))


@dataclass(frozen=True)
class FileRef:
    """A file outside the checkpoint directory: its path relative to the directory, digest, size and the digest's
    scheme (BLAKE3 for blobs stored by format 4; sha256 or chunked sha256 for older ones)."""

    path: str
    digest: str
    bytes: int
    scheme: DigestScheme = BLAKE3

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"path": self.path, self.scheme.key: self.digest, "bytes": self.bytes}
        if self.scheme.chunk_bytes is not None:
            entry["chunk_bytes"] = self.scheme.chunk_bytes
        return entry

    @classmethod
    def from_dict(cls, value: Any, where: str) -> FileRef:
        path = str(value.get("path")) if isinstance(value, dict) else ""
        prefix = f"../{BLOB_DIR}/"
        if not path.startswith(prefix) or not is_blob_name(path[len(prefix) :]):
            raise CheckpointDamagedError(f"{where} has an invalid blob reference {value!r}; the index is damaged")
        scheme = entry_scheme(value, f"{where}: blob reference {path}")
        return cls(path, str(value[scheme.key]), int(value.get("bytes", -1)), scheme)


def blob_name(entry: Mapping[str, Any], extension: str) -> str:
    """The content-addressed name of a blob whose index entry is `entry`: `<scheme>-<hex>.<ext>`."""
    scheme = entry_scheme(entry, "a new blob")
    return f"{scheme.key.replace('_', '-')}-{entry[scheme.key]}.{extension}"


def check_file_names(files: Mapping[str, Any], refs: Mapping[str, Any]) -> None:
    """File names a checkpoint may use: plain names, not hidden, not the index, each given once."""
    for name in [*files, *refs]:
        if not name or "/" in name or name.startswith(".") or name == INDEX_FILE:
            raise CheckpointError(f"invalid checkpoint file name {name!r}")
    if set(files) & set(refs):
        raise CheckpointError(f"checkpoint files {sorted(set(files) & set(refs))} are given both inline and as refs")


def index_bytes(entries: Mapping[str, Any], refs: Mapping[str, FileRef], meta: dict[str, Any]) -> bytes:
    """The index of a checkpoint with these file entries, blob references and meta, as written (format 4)."""
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
