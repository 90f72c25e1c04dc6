"""An ONNX export behind the parity gate: a model (an export, a registry version, a model directory) written as the
directory the gliner2-onnx runtime loads, published only when every exported precision extracts what the torch
model extracts on a golden set. What ``prefect-gliner2 export --format onnx`` and the flows' ONNX step run.

    1. before any work: the model's architecture and every golden record's schema are checked against what the
       runtime covers (``session_core.onnx_scope``; the loaded model's head, pooling and splitter next);
    2. the torch model extracts the golden records (each record's labels in its seeded shuffled order, the model's
       thresholds: export.json's fitted ones, else 0.5, or an explicit one), with confidences and offsets;
    3. the graphs are written into the staging directory of a directory commit (``training.onnx_export``);
    4. each precision's graphs extract the same records through the runtime (``runtime.onnx_extract``) and are
       compared (``session_core.onnx_parity``); any precision outside its tolerance refuses the whole export
       (``ParityError`` with the figures) and nothing is published;
    5. ``onnx_export.json`` (written last: the commit) records the source's provenance, thresholds, schema, the
       golden set, the tools and every precision's files, digests and parity figures; a registry version's lineage
       records the export and its figures (``onnx``).

``check_onnx`` runs steps 2 and 4 again on an existing export (after a copy, an upgrade of ONNX Runtime, or to see a
damaged file refused).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from prefect_gliner2.runtime.extract_model import ModelRef, resolve_model
from prefect_gliner2.runtime.onnx_model import read_onnx_record
from prefect_gliner2.session_core.canonical import RecordSet
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.evaluation import extraction_schemas
from prefect_gliner2.session_core.layout import MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE, ONNX_EXPORT_FILE
from prefect_gliner2.session_core.onnx_parity import ParityReport, check_parity, compare_extractions
from prefect_gliner2.session_core.onnx_scope import PRECISIONS, architecture_reason, schema_reasons
from prefect_gliner2.session_core.records import load_records
from prefect_gliner2.session_core.storage import directory_commit, resolve
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, Thresholds, fixed, read_thresholds
from prefect_gliner2.training.onnx_export import OPSET

__all__ = ["ONNX_FORMAT", "check_onnx", "export_onnx"]

ONNX_FORMAT = 1  # onnx_export.json's format
logger = logging.getLogger(__name__)


def export_onnx(
    model: str,
    out: str,
    golden: Any,
    precisions: Sequence[str] = ("fp32", "int8"),
    *,
    threshold: float | None = None,
    seed: int = 0,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Export `model` to `out` for `precisions` behind the parity gate on the `golden` records (a JSONL path or URL,
    or records); returns the record written to onnx_export.json. Raises ConfigError (before any work) for what the
    runtime cannot run, ParityError when a precision is outside its tolerance (nothing is published)."""
    chosen = _check_precisions(precisions)
    ref = resolve_model(model)
    _check_architecture(ref)
    records, texts, gold, schemas = _golden(golden, seed)
    thresholds, threshold_source = _thresholds(ref, threshold)
    torch_model = _load(ref)
    reference = _reference(torch_model, texts, schemas, thresholds, batch_size)
    with directory_commit(out, ONNX_EXPORT_FILE, what="ONNX export") as commit:
        local = Path(commit.local_dir())
        from prefect_gliner2.training.onnx_export import write_runtime_dir

        started = time.perf_counter()
        files = write_runtime_dir(torch_model, local, chosen)
        written = time.perf_counter() - started
        reports = _gate(str(local), chosen, texts, gold, schemas, thresholds, reference)
        check_parity(reports, f"of {model} to {out}")
        record = {
            "format": ONNX_FORMAT,
            "created_at": time.time(),
            "runtime": {"package": "gliner2-onnx", "load": "GLiNER2ONNXRuntime(DIR, precision=P)"},
            "precisions": {
                p: {"files": files[p], "sha256": _digests(local, files[p]), "parity": r.to_dict()}
                for p, r in zip(chosen, reports, strict=True)
            },
            "source": _provenance(ref),
            "thresholds": thresholds.to_dict(),
            "threshold_source": threshold_source,
            "schema": ref.trained_schema() or _golden_schema(gold),
            "golden": _golden_info(golden, records, seed),
            "tools": _tools(written),
        }
        commit.commit(json.dumps(record, indent=1).encode())
    _record_in_registry(ref, out, record)
    for report in reports:
        logger.info("ONNX export %s: %s", out, report.summary())
    return record


def check_onnx(onnx_dir: str, model: str, golden: Any, *, seed: int = 0, batch_size: int = 8) -> list[ParityReport]:
    """The parity gate again on an existing ONNX export at `onnx_dir` against `model` (every precision it has, its
    recorded thresholds): returns the reports, or raises ParityError with them."""
    record = read_onnx_record(onnx_dir)
    if record is None:
        raise ConfigError(f"{onnx_dir} is not an ONNX export ({ONNX_EXPORT_FILE} not found)")
    precisions = [p for p in PRECISIONS if p in (record.get("precisions") or {})]
    thresholds = Thresholds.from_dict(record["thresholds"])
    ref = resolve_model(model)
    _, texts, gold, schemas = _golden(golden, seed)
    reference = _reference(_load(ref), texts, schemas, thresholds, batch_size)
    reports = _gate(onnx_dir, precisions, texts, gold, schemas, thresholds, reference)
    check_parity(reports, f"at {onnx_dir} (checked against {model})")
    return reports


def _check_precisions(precisions: Sequence[str]) -> list[str]:
    chosen = [p for p in PRECISIONS if p in set(precisions)]
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown or not chosen:
        raise ConfigError(f"precision must be some of {list(PRECISIONS)}, got {list(precisions)}")
    return chosen


def _check_architecture(ref: ModelRef) -> None:
    from prefect_gliner2.runtime.model_sources import parse_tiny

    tiny = parse_tiny(ref.uri)
    if tiny is not None:
        config: Mapping[str, Any] = {"architecture": tiny[0]}
    else:
        fs, path = resolve(ref.uri)
        marker = f"{path.rstrip('/')}/{MODEL_CONFIG_FILE}"
        config = json.loads(fs.cat_file(marker)) if fs.exists(marker) else {}
    reason = architecture_reason(config)
    if reason is not None:
        raise ConfigError(f"model {ref.source!r} cannot be exported to ONNX: {reason}")


def _golden(golden: Any, seed: int) -> tuple[RecordSet, list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """The golden records, their texts, gold outputs and the schemas they are asked with (the data set's labels,
    each record's in its seeded shuffled order), every schema checked against the runtime's coverage."""
    if golden is None:
        raise ConfigError(
            "the parity gate needs gold records: pass --data GOLD.jsonl (the run's validation records, or any golden "
            "set of training-format records)"
        )
    records = load_records(golden, what="golden")
    examples = [record.example for record in records]
    texts = [str(example["input"]) for example in examples]
    gold = [dict(example["output"]) for example in examples]
    schemas = extraction_schemas(gold, seed=seed)
    reasons = sorted({reason for schema in schemas for reason in schema_reasons(schema)})
    if reasons:
        raise ConfigError(
            f"the golden records ask what the ONNX runtime cannot extract: {'; '.join(reasons)}. An ONNX export "
            "covers entity tasks of span models: give golden records with entities only"
        )
    return records, texts, gold, schemas


def _thresholds(ref: ModelRef, explicit: float | None) -> tuple[Thresholds, str]:
    if explicit is not None:
        return fixed(explicit), f"{explicit} (given explicitly)"
    recorded = read_thresholds(ref.uri) if ref.export_info else None
    if recorded is None:
        return fixed(DEFAULT_THRESHOLD), f"{DEFAULT_THRESHOLD} (gliner2's default: the model records no thresholds)"
    return recorded, "fitted (from the model's export.json)"


def _load(ref: ModelRef) -> Any:
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training.engine.lora import is_peft
    from prefect_gliner2.training.engine.onnx_graphs import unsupported
    from prefect_gliner2.training.weights import load_exported_model

    fs, path = resolve(ref.uri) if "://" in ref.uri or ref.uri.startswith("/") else (None, None)
    model = load_exported_model(ref.uri) if fs is not None and fs.isdir(path) else load_model(ref.uri)
    if is_peft(model):
        model = model.merge_and_unload()  # this loaded copy only
    model = model.to("cpu").eval()
    reasons = unsupported(model)
    if reasons:
        raise ConfigError(f"model {ref.source!r} cannot be exported to ONNX: {'; '.join(reasons)}")
    return model


def _reference(
    model: Any, texts: list[str], schemas: list[dict[str, Any]], thresholds: Thresholds, batch_size: int
) -> list[dict[str, Any]]:
    from prefect_gliner2.training.onnx_export import reference_extract

    return reference_extract(model, texts, schemas, thresholds, batch_size)


def _gate(
    directory: str,
    precisions: Sequence[str],
    texts: list[str],
    gold: list[dict[str, Any]],
    schemas: list[dict[str, Any]],
    thresholds: Thresholds,
    reference: list[dict[str, Any]],
) -> list[ParityReport]:
    from prefect_gliner2.runtime.onnx_extract import OnnxExtractor

    reports = []
    for precision in precisions:
        extractor = OnnxExtractor(directory, precision, per_label=thresholds, chunk_size=1 << 30, chunk_overlap=0)
        detailed = extractor.extract_detailed(texts, schemas)
        reports.append(compare_extractions(precision, gold, reference, detailed))
    return reports


def _digests(directory: Path, files: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, relative in files.items():
        digest = hashlib.sha256()
        with open(directory / relative, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[name] = digest.hexdigest()
    return out


def _provenance(ref: ModelRef) -> dict[str, Any]:
    """Where the torch weights came from: the reference, its directory, registry version, identity and digest."""
    info = ref.export_info
    weights = info.get("weights_sha256")
    if not weights:
        fs, path = resolve(ref.uri) if ref.uri.startswith("/") or "://" in ref.uri else (None, None)
        file = f"{path}/{MODEL_WEIGHTS_FILE}" if path else None
        if fs is not None and file and fs.exists(file):
            digest = hashlib.sha256()
            with fs.open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            weights = digest.hexdigest()
    return {
        "model": ref.source,
        "uri": ref.uri,
        "version": ref.version,
        "identity": ref.identity,
        "weights_sha256": weights,
        "step": info.get("step"),
    }


def _golden_schema(gold: list[dict[str, Any]]) -> dict[str, Any]:
    from prefect_gliner2.session_core.scoring import DatasetSchema, inference_schema

    return inference_schema({}, DatasetSchema.of(gold))


def _golden_info(golden: Any, records: RecordSet, seed: int) -> dict[str, Any]:
    return {
        "uri": golden if isinstance(golden, str) else None,
        "records": len(records),
        "sha256": records.digest_hex,
        "label_order": "shuffled",
        "seed": seed,
    }


def _tools(export_seconds: float) -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in ("torch", "onnx", "onnxruntime", "gliner2", "gliner2-onnx", "transformers"):
        try:
            versions[name] = package_version(name)
        except Exception:  # noqa: BLE001 - a version we cannot read is recorded as unknown
            versions[name] = None
    return {
        **versions,
        "exporter": "torch.onnx.export (TorchScript, dynamo=False)",
        "opset": OPSET,
        "quantization": "onnxruntime.quantization.quantize_dynamic (QInt8 weights per channel)",
        "export_seconds": round(export_seconds, 2),
    }


def _record_in_registry(ref: ModelRef, out: str, record: Mapping[str, Any]) -> None:
    """A registry version's lineage records its ONNX export and the parity figures."""
    if ref.version is None:
        return
    from prefect_gliner2.model_registry.store import ModelRegistry
    from prefect_gliner2.session_core.storage import absolute_uri

    root, name, _versions, version = ref.uri.rstrip("/").rsplit("/", 3)
    ModelRegistry(root, name).record_onnx(version, absolute_uri(out), record)
