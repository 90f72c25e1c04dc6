"""Atomic, hash-verified checkpoint directories on any fsspec storage (torch-free).

A checkpoint is a directory of named files plus `checkpoint.json`, the index, written last: it lists every file
with its sha256 and size, the format name and version, and a small `meta` dict. A directory without a valid index
is not a checkpoint. On local storage the files are written into a hidden sibling directory, fsynced, and renamed
into place, so a kill at any moment leaves either nothing or a complete checkpoint; on object stores the index is
the commit marker. Reading verifies every hash and size before anything is deserialised.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import fsspec

from .atomic import fsync_dir, upload_progress
from .errors import CheckpointError

INDEX_FILE = "checkpoint.json"
FORMAT_NAME = "prefect-gliner2/checkpoint"
FORMAT_VERSION = 1

__all__ = [
    "FORMAT_VERSION",
    "INDEX_FILE",
    "STAGING_MARKER",
    "CheckpointFiles",
    "checkpoint_exists",
    "checkpoint_meta",
    "read_checkpoint",
    "write_checkpoint",
]

# Local writes stage into a hidden sibling named ".<name>.partial-<pid>-<random>"; cleaners may rely on this marker.
STAGING_MARKER = ".partial-"


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


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def checkpoint_exists(uri: str) -> bool:
    """True when `uri` holds a committed checkpoint index (contents are not verified here)."""
    fs, path = fsspec.core.url_to_fs(uri)
    return bool(fs.exists(f"{path.rstrip('/')}/{INDEX_FILE}"))


def checkpoint_meta(uri: str) -> dict[str, Any] | None:
    """The index's `meta` of a committed checkpoint without reading its files (None when there is no index).

    Cheap, for finding and describing checkpoints; `read_checkpoint` still verifies everything before a restore.
    """
    fs, path = fsspec.core.url_to_fs(uri)
    index_path = f"{path.rstrip('/')}/{INDEX_FILE}"
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


def write_checkpoint(uri: str, files: dict[str, bytes], meta: dict[str, Any]) -> str:
    """Write `files` and the index atomically to `uri` (which must not exist yet); returns the index sha256."""
    for name in files:
        if not name or "/" in name or name.startswith(".") or name == INDEX_FILE:
            raise CheckpointError(f"invalid checkpoint file name {name!r}")
    fs, path = fsspec.core.url_to_fs(uri)
    path = path.rstrip("/")
    if fs.exists(path) and (not fs.isdir(path) or fs.ls(path)):
        raise CheckpointError(
            f"checkpoint destination {uri} already exists; checkpoints are immutable, choose a new location"
        )
    index = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "files": {name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in sorted(files.items())},
        "meta": meta,
    }
    index_bytes = json.dumps(index, sort_keys=True, indent=1).encode()
    if _is_local(fs):
        _write_local(path, files, index_bytes)
    else:
        fs.makedirs(path, exist_ok=True)
        for name, data in files.items():
            with fs.open(f"{path}/{name}", "wb") as handle:
                handle.write(data)
            upload_progress("checkpoint")
        with fs.open(f"{path}/{INDEX_FILE}", "wb") as handle:
            handle.write(index_bytes)
    return _sha256(index_bytes)


def _write_local(path: str, files: dict[str, bytes], index_bytes: bytes) -> None:
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, mode=0o700, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(path)}{STAGING_MARKER}{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(staging, 0o700)
    try:
        for name, data in [*files.items(), (INDEX_FILE, index_bytes)]:
            target = os.path.join(staging, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        fsync_dir(staging)
        if os.path.isdir(path):
            os.rmdir(path)  # an empty directory someone created for us
        os.rename(staging, path)
        fsync_dir(parent)
    except BaseException:
        for name in os.listdir(staging) if os.path.isdir(staging) else []:
            os.unlink(os.path.join(staging, name))
        if os.path.isdir(staging):
            os.rmdir(staging)
        raise


def read_checkpoint(uri: str) -> CheckpointFiles:
    """Read and verify a checkpoint: the index, then every listed file's size and sha256."""
    fs, path = fsspec.core.url_to_fs(uri)
    path = path.rstrip("/")
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
