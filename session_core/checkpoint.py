"""Atomic, hash-verified checkpoint directories on any fsspec storage (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its sha256 and size, the format name and version, and a small `meta` dict. A directory without a valid index
is not a checkpoint. Writing is a ``storage.directory_commit`` with the index as its marker: on local storage the
files are staged in a hidden sibling directory, fsynced, and renamed into place, so a kill at any moment leaves
either nothing or a complete checkpoint; on object stores the index is the commit marker. Reading verifies every
hash and size before anything is deserialised. File names come from ``layout``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import CheckpointError
from .layout import CHECKPOINT_INDEX_FILE as INDEX_FILE
from .storage import directory_commit, resolve

FORMAT_NAME = "prefect-gliner2/checkpoint"
FORMAT_VERSION = 1

__all__ = [
    "FORMAT_VERSION",
    "CheckpointFiles",
    "checkpoint_exists",
    "checkpoint_meta",
    "read_checkpoint",
    "write_checkpoint",
]


@dataclass
class CheckpointFiles:
    """The verified contents of a checkpoint: file bytes by name and the index's meta dict."""

    files: dict[str, bytes]
    meta: dict[str, Any] = field(default_factory=dict)
    uri: str = ""

    def require(self, name: str) -> bytes:
        try:
            return self.files[name]
        except KeyError:
            raise CheckpointError(
                f"checkpoint {self.uri} has no {name}; it was written by another tool or version"
            ) from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checkpoint_exists(uri: str) -> bool:
    """True when `uri` holds a committed checkpoint index (contents are not verified here)."""
    fs, path = resolve(uri)
    return bool(fs.exists(f"{path}/{INDEX_FILE}"))


def checkpoint_meta(uri: str) -> dict[str, Any] | None:
    """The index's `meta` of a committed checkpoint without reading its files (None when there is no index).

    Cheap, for finding and describing checkpoints; `read_checkpoint` still verifies everything before a restore.
    """
    fs, path = resolve(uri)
    index_path = f"{path}/{INDEX_FILE}"
    if not fs.exists(index_path):
        return None
    try:
        index = json.loads(fs.cat_file(index_path))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"checkpoint index {index_path} is not valid JSON ({exc}); the checkpoint is damaged"
        ) from exc
    meta = index.get("meta") if isinstance(index, dict) else None
    return meta if isinstance(meta, dict) else {}


def write_checkpoint(
    uri: str, files: dict[str, bytes], meta: dict[str, Any], *, before_commit: Callable[[], None] | None = None
) -> str:
    """Write `files` and the index atomically to `uri` (which must not exist yet); returns the index sha256.

    `before_commit` runs when every file but the index is in place (tests use it to kill a writer there)."""
    for name in files:
        if not name or "/" in name or name.startswith(".") or name == INDEX_FILE:
            raise CheckpointError(f"invalid checkpoint file name {name!r}")
    index = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "files": {name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in sorted(files.items())},
        "meta": meta,
    }
    index_bytes = json.dumps(index, sort_keys=True, indent=1).encode()
    try:
        commit = directory_commit(uri, INDEX_FILE, what="checkpoint", before_commit=before_commit)
    except FileExistsError:
        raise CheckpointError(
            f"checkpoint destination {uri} already exists; checkpoints are immutable, choose a new location"
        ) from None
    with commit:
        for name, data in files.items():
            commit.write(name, data)
        commit.commit(index_bytes)
    return _sha256(index_bytes)


def read_checkpoint(uri: str) -> CheckpointFiles:
    """Read and verify a checkpoint: the index, then every listed file's size and sha256."""
    fs, path = resolve(uri)
    index_path = f"{path}/{INDEX_FILE}"
    if not fs.exists(index_path):
        hint = " (it holds files but no index: an incomplete write)" if fs.exists(path) else ""
        raise CheckpointError(f"no committed checkpoint at {uri}{hint}; pass the directory a save_state call wrote")
    try:
        index = json.loads(fs.cat_file(index_path))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"checkpoint index {index_path} is not valid JSON ({exc}); the checkpoint is damaged"
        ) from exc
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{uri} is not a prefect-gliner2 checkpoint "
            f"(format {index.get('format') if isinstance(index, dict) else None!r})"
        )
    if not isinstance(index.get("version"), int) or index["version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {uri} has format version {index.get('version')!r}, newer than this installation reads "
            f"({FORMAT_VERSION}); upgrade prefect-gliner2"
        )
    files: dict[str, bytes] = {}
    for name, entry in sorted(index.get("files", {}).items()):
        file_path = f"{path}/{name}"
        if not fs.exists(file_path):
            raise CheckpointError(
                f"checkpoint {uri} is missing {name}; restore it from a copy or use an earlier checkpoint"
            )
        data = fs.cat_file(file_path)
        if len(data) != entry.get("bytes"):
            raise CheckpointError(
                f"checkpoint file {name} in {uri} has {len(data)} bytes, the index says {entry.get('bytes')}: "
                "truncated or replaced; use an earlier checkpoint"
            )
        if _sha256(data) != entry.get("sha256"):
            raise CheckpointError(
                f"checkpoint file {name} in {uri} does not match its recorded sha256: edited or corrupted; "
                "use an earlier checkpoint"
            )
        files[name] = data
    return CheckpointFiles(files=files, meta=index.get("meta", {}), uri=uri)
