"""The training flows' optional ONNX step: after the export, the exported model as an ONNX export in its onnx/
folder, gated on the run's validation records (Prefect-free).

``check_onnx_step`` runs before any training (torch-free): the run must have validation records (the gate's gold
records), a span model, and validation records the ONNX runtime can ask, and the ``onnx`` extra must be installed.
``export_run_onnx`` is the step itself (torch: the flow's task runs it in a spawned process, so the flow process
stays torch-free); a step that already committed returns its record.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.evaluation import extraction_schemas
from prefect_gliner2.session_core.layout import ONNX_DIR
from prefect_gliner2.session_core.onnx_scope import PRECISIONS, architecture_reason, schema_reasons

__all__ = ["check_onnx_step", "eval_examples", "export_run_onnx", "onnx_out"]


def onnx_out(export_uri: str) -> str:
    """Where a run's ONNX export goes: the onnx/ folder of its model export (the registry keeps it with it)."""
    return f"{export_uri.rstrip('/')}/{ONNX_DIR}"


def eval_examples(manifest: bytes | None, manifest_uri: str) -> list[dict[str, Any]]:
    """The run's validation records, from its manifest (the bytes of a new run, else the run directory's)."""
    from prefect_gliner2.session_core.manifest import read_manifest

    data = json.loads(manifest) if manifest is not None else read_manifest(manifest_uri)
    return list(data.get("eval_examples") or [])


def check_onnx_step(
    precisions: Sequence[str], architecture: str, examples: Sequence[Mapping[str, Any]], *, seed: int
) -> None:
    """Refuse, before any training, an ONNX step that cannot succeed; says which and why."""
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown or not precisions:
        raise ConfigError(f"onnx must list precisions of {list(PRECISIONS)}, got {list(precisions)}")
    missing = [name for name in ("onnxruntime", "onnx", "gliner2_onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"the ONNX step needs {', '.join(missing)}: install prefect-gliner2[onnx] (pip install "
            "'prefect-gliner2[onnx]'), or leave onnx empty"
        )
    reason = architecture_reason({"architecture": architecture})
    if reason is not None:
        raise ConfigError(f"the ONNX step cannot export this run's model: {reason}; leave onnx empty")
    if not examples:
        raise ConfigError(
            "the ONNX step's parity gate extracts the run's validation records, and this run has none: pass "
            "valid_data, or leave onnx empty"
        )
    outputs = [dict(example["output"]) for example in examples]
    reasons = sorted({r for schema in extraction_schemas(outputs, seed=seed) for r in schema_reasons(schema)})
    if reasons:
        raise ConfigError(
            f"the ONNX step cannot gate this run: its validation records ask {'; '.join(reasons)}; an ONNX export "
            "covers entity tasks only. Leave onnx empty"
        )


def export_run_onnx(
    export_uri: str, manifest_uri: str, precisions: Sequence[str], seed: int
) -> tuple[dict[str, Any], bool]:
    """The run's ONNX export (``runtime.onnx_publish.export_onnx`` of its model export, gated on its validation
    records): (its record, whether an earlier attempt had committed it)."""
    from prefect_gliner2.runtime.onnx_model import read_onnx_record
    from prefect_gliner2.runtime.onnx_publish import export_onnx

    out = onnx_out(export_uri)
    existing = read_onnx_record(out)
    if existing is not None:
        return existing, True
    golden = eval_examples(None, manifest_uri)
    return export_onnx(export_uri, out, golden, list(precisions), seed=seed), False
