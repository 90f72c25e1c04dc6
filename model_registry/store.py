"""A simple, durable model registry on any fsspec storage: versioned model directories and an atomic pointer.

    <root>/<name>/versions/v000001/   a native model directory (as export_weights wrote it) + lineage.json
    <root>/<name>/versions/v000002/   ...
    <root>/<name>/CURRENT.json        {"version": "v000002", "previous": "v000001", "updated_at": ...}

A version directory is complete when its `lineage.json` exists (written last); incomplete ones are invisible. The
pointer is replaced atomically (a temp file renamed over it locally; a single object write elsewhere), so a reader
sees the old or the new version, never half of one. Rolling back is pointing CURRENT at an older version. Lineage
records where a version came from: base model hash, data fingerprint, manifest fingerprint, run key, metrics, and
the extraction thresholds fitted at export (``thresholds``, from the model's export.json; None when it has none),
and its ONNX export with the parity gate's figures (``onnx``: from the model's onnx/ when registered with one, or
recorded later by ``record_onnx``; None when it has none).
Every URI it stores and reports is absolute (a local root is made absolute). Torch-free and Prefect-free.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import fsspec

from prefect_gliner2.model_registry.mlflow_sync import mirror_promotion
from prefect_gliner2.session_core import storage
from prefect_gliner2.session_core.errors import SessionCoreError
from prefect_gliner2.session_core.layout import (
    MODEL_CONFIG_FILE,
    ONNX_DIR,
    ONNX_EXPORT_FILE,
    REGISTRY_LINEAGE_FILE,
    REGISTRY_POINTER_FILE,
    REGISTRY_VERSIONS_DIR,
)
from prefect_gliner2.session_core.storage import absolute_uri
from prefect_gliner2.session_core.thresholds import THRESHOLDS_KEY, read_thresholds

__all__ = ["ModelRegistry", "ModelVersion", "RegistryError"]

_VERSION = re.compile(r"^v(\d{6})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistryError(SessionCoreError, ValueError):
    """A registry name, version or pointer is invalid or missing."""


@dataclass(frozen=True)
class ModelVersion:
    """One registered model: its version id, directory URI and lineage."""

    version: str
    uri: str
    lineage: dict[str, Any] = field(default_factory=dict)

    @property
    def number(self) -> int:
        return int(self.version[1:])


class ModelRegistry:
    """Versions of one named model under `root` (a local directory or fsspec URL)."""

    def __init__(self, root: str, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
            raise RegistryError(f"model name {name!r} must be 1-128 letters, digits, '.', '_' or '-' (no slashes)")
        root = absolute_uri(root)  # versions are reported with absolute URIs, usable from anywhere
        self.fs, base = fsspec.core.url_to_fs(root)
        self.name = name
        self.root = root.rstrip("/")
        self.path = f"{base.rstrip('/')}/{name}"
        self.local = storage.is_local(self.fs)

    # ---- reading ---------------------------------------------------------------------------------------------

    def versions(self) -> list[ModelVersion]:
        """Complete versions, oldest first."""
        folder = f"{self.path}/{REGISTRY_VERSIONS_DIR}"
        if not self.fs.exists(folder):
            return []
        found = []
        for entry in self.fs.ls(folder, detail=False):
            version = entry.rstrip("/").rsplit("/", 1)[-1]
            if _VERSION.match(version) and self.fs.exists(f"{folder}/{version}/{REGISTRY_LINEAGE_FILE}"):
                found.append(self.get(version))
        return sorted(found, key=lambda v: v.number)

    def get(self, version: str) -> ModelVersion:
        if not isinstance(version, str) or not _VERSION.match(version):
            raise RegistryError(f"version {version!r} is not of the form v000001")
        lineage_path = f"{self.path}/{REGISTRY_VERSIONS_DIR}/{version}/{REGISTRY_LINEAGE_FILE}"
        if not self.fs.exists(lineage_path):
            raise RegistryError(f"{self.name} has no complete version {version}; list versions() to see what exists")
        lineage = json.loads(self.fs.cat_file(lineage_path))
        return ModelVersion(version=version, uri=self._uri(f"{REGISTRY_VERSIONS_DIR}/{version}"), lineage=lineage)

    def latest(self) -> ModelVersion | None:
        """The newest registered version, promoted or not (what change detection compares against)."""
        versions = self.versions()
        return versions[-1] if versions else None

    def current(self) -> ModelVersion | None:
        """The version CURRENT points at (None before the first promotion)."""
        pointer = f"{self.path}/{REGISTRY_POINTER_FILE}"
        if not self.fs.exists(pointer):
            return None
        try:
            data = json.loads(self.fs.cat_file(pointer))
        except ValueError as exc:
            raise RegistryError(
                f"{self.name}'s {REGISTRY_POINTER_FILE} is not valid JSON ({exc}); promote a version again"
            ) from exc
        return self.get(data["version"])

    # ---- writing ---------------------------------------------------------------------------------------------

    def register(self, source: str, lineage: dict[str, Any]) -> ModelVersion:
        """Copy a model directory in as the next version; lineage.json is written last (the commit marker)."""
        src_fs, src_path = fsspec.core.url_to_fs(source)
        if not src_fs.isdir(src_path) or not src_fs.exists(f"{src_path.rstrip('/')}/{MODEL_CONFIG_FILE}"):
            raise RegistryError(f"cannot register {source}: it is not a model directory with {MODEL_CONFIG_FILE}")
        version = self._claim_next()
        target = f"{self.path}/{REGISTRY_VERSIONS_DIR}/{version}"
        for entry in src_fs.find(src_path.rstrip("/")):
            relative = entry[len(src_path.rstrip("/")) + 1 :]
            parent = f"{target}/{relative}".rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            with src_fs.open(entry, "rb") as reader, self.fs.open(f"{target}/{relative}", "wb") as writer:
                writer.write(reader.read())
        record = {**lineage, "version": version, "registered_at": time.time(), "source": absolute_uri(source)}
        recorded = read_thresholds(source)  # the thresholds fitted at export travel with the version
        record[THRESHOLDS_KEY] = recorded.to_dict() if recorded is not None else None
        onnx = f"{src_path.rstrip('/')}/{ONNX_DIR}/{ONNX_EXPORT_FILE}"
        if src_fs.exists(onnx):  # an ONNX export inside the model (a training flow's ONNX step) travels with it
            record["onnx"] = onnx_lineage(
                self._uri(f"{REGISTRY_VERSIONS_DIR}/{version}/{ONNX_DIR}"), src_fs.cat_file(onnx)
            )
        self._write_atomic(f"{target}/{REGISTRY_LINEAGE_FILE}", json.dumps(record, indent=1, sort_keys=True).encode())
        return self.get(version)

    def record_onnx(self, version: str, uri: str, export_record: Any) -> ModelVersion:
        """Record an ONNX export of `version` (its directory and the parity gate's figures) in the version's lineage,
        replacing an earlier one; the lineage file is rewritten atomically."""
        chosen = self.get(version)
        lineage = {**chosen.lineage, "onnx": onnx_lineage(uri, export_record)}
        path = f"{self.path}/{REGISTRY_VERSIONS_DIR}/{version}/{REGISTRY_LINEAGE_FILE}"
        self._write_atomic(path, json.dumps(lineage, indent=1, sort_keys=True).encode())
        return self.get(version)

    def promote(self, version: str) -> ModelVersion:
        """Point CURRENT at `version` (also how a rollback is done)."""
        chosen = self.get(version)
        previous = self.current()
        pointer = {
            "version": chosen.version,
            "previous": previous.version if previous else None,
            "updated_at": time.time(),
        }
        self.fs.makedirs(self.path, exist_ok=True)
        self._write_atomic(f"{self.path}/{REGISTRY_POINTER_FILE}", json.dumps(pointer, sort_keys=True).encode())
        mirror_promotion(self, chosen)  # MLflow, when configured: a model version with the alias champion
        return chosen

    def _claim_next(self) -> str:
        folder = f"{self.path}/{REGISTRY_VERSIONS_DIR}"
        self.fs.makedirs(folder, exist_ok=True)
        try:
            entries = self.fs.ls(folder, detail=False)
        except FileNotFoundError:  # an object store has no empty folder: nothing registered yet
            entries = []
        taken = [int(m.group(1)) for e in entries if (m := _VERSION.match(e.rstrip("/").rsplit("/", 1)[-1]))]
        number = max(taken, default=0) + 1
        while True:
            version = f"v{number:06d}"
            if self.local:
                try:
                    os.mkdir(f"{folder}/{version}", 0o700)  # atomic claim against a concurrent registration
                    return version
                except FileExistsError:
                    number += 1
                    continue
            if not self.fs.exists(f"{folder}/{version}"):
                self.fs.makedirs(f"{folder}/{version}", exist_ok=True)
                return version
            number += 1

    def _write_atomic(self, path: str, data: bytes) -> None:
        storage.write_atomic(self.fs, path, data)

    def _uri(self, relative: str) -> str:
        return f"{self.root}/{self.name}/{relative}"


def onnx_lineage(uri: str, export_record: Any) -> dict[str, Any]:
    """What a lineage keeps of an ONNX export's record (onnx_export.json, as bytes or parsed): where it is, and per
    precision the parity gate's verdict, span agreement, F1 of both runtimes and their difference."""
    record = json.loads(export_record) if isinstance(export_record, (bytes, str)) else dict(export_record)
    keys = ("passed", "span_agreement", "max_score_diff", "f1_torch", "f1_onnx", "f1_diff", "records", "rule")
    return {
        "uri": uri,
        "created_at": record.get("created_at"),
        "golden": record.get("golden"),
        "precisions": {
            precision: {key: (entry.get("parity") or {}).get(key) for key in keys}
            for precision, entry in (record.get("precisions") or {}).items()
        },
    }
