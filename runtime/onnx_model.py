"""Which ONNX export a model reference names, and what its record says (torch-free, Prefect-free).

    ./model-onnx                   an ONNX export (its onnx_export.json)
    ./model                        a model export holding one in onnx/ (a training flow's optional ONNX step)
    ./registry/ner[@v000002]       a registry version: the ONNX export its lineage records (``onnx``), else its onnx/

A precision is usable only when the export's parity gate passed for it (``onnx_export.json`` records the figures);
without ``precision`` the export's first of fp32, int8, fp16 is used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from prefect_gliner2.runtime.extract_model import ModelRef, resolve_model
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.layout import ONNX_DIR, ONNX_EXPORT_FILE
from prefect_gliner2.session_core.onnx_scope import PRECISIONS
from prefect_gliner2.session_core.storage import absolute_uri, resolve

__all__ = ["choose_precision", "read_onnx_record", "resolve_onnx"]


def read_onnx_record(uri: str) -> dict[str, Any] | None:
    """The onnx_export.json of the ONNX export at `uri` (None when there is none: not an ONNX export, or one whose
    commit never happened)."""
    fs, path = resolve(uri)
    marker = f"{path.rstrip('/')}/{ONNX_EXPORT_FILE}"
    if not fs.exists(marker):
        return None
    record = json.loads(fs.cat_file(marker))
    return dict(record) if isinstance(record, Mapping) else None


def resolve_onnx(source: str) -> ModelRef:
    """The ONNX export `source` names, as a ModelRef: `uri` is the ONNX directory, `export_info` its record and
    `identity` changes with any of its files (the record holds every graph's sha256)."""
    from prefect_gliner2.runtime.model_sources import parse_tiny

    hint = (
        f"export it first: prefect-gliner2 export --model {source} --format onnx --data GOLD.jsonl --out DIR, then "
        "extract with --model DIR"
    )
    if parse_tiny(source) is not None:
        raise ConfigError(f"model {source!r} is a built-in torch model, not an ONNX export; {hint}")
    direct = _candidate(source)
    if direct is not None:
        return direct
    ref = resolve_model(source)  # a registry reference, an export or a model directory (or a clear error)
    lineage_uri = _lineage_onnx_uri(ref)
    for uri in [u for u in (lineage_uri, f"{ref.uri.rstrip('/')}/{ONNX_DIR}") if u]:
        found = _candidate(uri, source=source, version=ref.version)
        if found is not None:
            return found
    raise ConfigError(f"model {source!r} has no ONNX export ({ONNX_EXPORT_FILE} not found); {hint}")


def _candidate(uri: str, *, source: str | None = None, version: str | None = None) -> ModelRef | None:
    try:
        record = read_onnx_record(uri)
    except (OSError, ValueError):
        return None
    if record is None:
        return None
    location = absolute_uri(uri).rstrip("/")
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return ModelRef(source or uri, location, version, f"{location}#onnx={digest}", record)


def _lineage_onnx_uri(ref: ModelRef) -> str | None:
    if ref.version is None:
        return None
    from prefect_gliner2.model_registry.store import ModelRegistry

    root, name, _versions, _version = ref.uri.rstrip("/").rsplit("/", 3)  # ROOT/NAME/versions/v000001
    onnx = ModelRegistry(root, name).get(ref.version).lineage.get("onnx")
    return str(onnx["uri"]) if isinstance(onnx, Mapping) and onnx.get("uri") else None


def choose_precision(ref: ModelRef, asked: str | None) -> str:
    """The precision to run: `asked` (or the first exported of fp32, int8, fp16), refused unless its parity gate
    passed."""
    precisions: Mapping[str, Any] = ref.export_info.get("precisions") or {}
    if asked is not None and asked not in PRECISIONS:
        raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {asked!r}")
    chosen = asked or next((p for p in PRECISIONS if p in precisions), None)
    if chosen is None or chosen not in precisions:
        raise ConfigError(
            f"the ONNX export {ref.uri} has no {asked or 'usable'} precision (it has {sorted(precisions)}); export "
            f"it with --precision {asked or 'fp32'}"
        )
    parity = precisions[chosen].get("parity") or {}
    if not parity.get("passed"):
        raise ConfigError(f"the ONNX export {ref.uri} records no passed parity gate for {chosen}; export it again")
    return chosen
