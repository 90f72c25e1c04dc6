"""The torch side of an ONNX export: a span model written as the directory the gliner2-onnx runtime loads, and the
torch model's own extractions the parity gate compares the graphs with.

    <out>/gliner2_config.json     max_width, special token ids, onnx_files: precision -> the four graphs (the runtime's)
    <out>/config.json             the model's gliner2 config (the runtime requires a config.json)
    <out>/tokenizer.json ...      the model's tokenizer, gliner2's special tokens included (AutoTokenizer loads it)
    <out>/fp32/encoder.onnx       encoder, span_rep, count_embed, classifier (``engine.onnx_graphs``)
    <out>/int8/encoder.onnx       the fp32 graphs, dynamically quantized by ONNX Runtime (int8 weights)
    <out>/fp16/encoder.onnx       the fp32 graphs converted by ONNX Runtime's float16 tool, fp32 inputs and outputs

Exporter: ``torch.onnx.export(..., dynamo=False)``, the TorchScript-based exporter. On torch 2.13 CPU it exports
the four graphs of the tiny DeBERTa-v3 and MiniLM models in seconds with no further dependency; the torch.export
based exporter (``dynamo=True``) needs ``onnxscript`` and took 56 s for the tiny DeBERTa encoder alone. The traced
graphs keep dynamic batch, token, span and label axes (the parity gate runs them on texts of every length).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.onnx_scope import PRECISIONS
from prefect_gliner2.session_core.thresholds import Thresholds

__all__ = [
    "ONNX_RUNTIME_CONFIG_FILE",
    "OPSET",
    "reference_extract",
    "write_runtime_dir",
]

ONNX_RUNTIME_CONFIG_FILE = "gliner2_config.json"  # the runtime's own name
OPSET = 17
logger = logging.getLogger(__name__)


def write_runtime_dir(model: Any, directory: Path, precisions: Sequence[str]) -> dict[str, dict[str, str]]:
    """Write the runtime's files for `precisions` into `directory` (fp32 graphs always: the others derive from
    them); returns gliner2_config.json's ``onnx_files``."""
    from prefect_gliner2.training.engine.onnx_graphs import model_facts

    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown or not precisions:
        raise ConfigError(f"precisions must be some of {list(PRECISIONS)}, got {list(precisions)}")
    files = {"fp32": _export_fp32(model, directory)}
    for precision in precisions:
        if precision == "int8":
            files["int8"] = _derive(directory, files["fp32"], "int8", _quantize_int8)
        elif precision == "fp16":
            files["fp16"] = _derive(directory, files["fp32"], "fp16", _to_fp16)
    if "fp32" not in precisions:  # derived from, not shipped
        for relative in files.pop("fp32").values():
            (directory / relative).unlink()
        (directory / "fp32").rmdir()
    facts = model_facts(model)
    config = {"max_width": facts["max_width"], "special_tokens": facts["special_tokens"], "onnx_files": files}
    (directory / ONNX_RUNTIME_CONFIG_FILE).write_text(json.dumps(config, indent=1))
    model.processor.tokenizer.save_pretrained(str(directory))
    model.config.to_json_file(str(directory / "config.json"))
    _check_tokenizer(model, directory)
    return files


def _export_fp32(model: Any, directory: Path) -> dict[str, str]:
    import torch

    from prefect_gliner2.training.engine.onnx_graphs import graph_specs

    (directory / "fp32").mkdir(parents=True)
    files = {}
    with torch.no_grad(), warnings.catch_warnings():
        # the TorchScript exporter's deprecation notice, and the tracer's notes on Python values it records as
        # constants (the count loop unrolled once, transformers' size arithmetic): the parity gate checks the graphs
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", UserWarning)
        for spec in graph_specs(model):
            relative = f"fp32/{spec.name}.onnx"
            torch.onnx.export(
                spec.module.eval(),
                spec.inputs,
                str(directory / relative),
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                dynamic_axes=spec.dynamic_axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
            files[spec.name] = relative
    return files


def _derive(directory: Path, fp32: Mapping[str, str], precision: str, convert: Any) -> dict[str, str]:
    (directory / precision).mkdir()
    files = {}
    for name, relative in fp32.items():
        target = f"{precision}/{name}.onnx"
        convert(directory / relative, directory / target)
        files[name] = target
    return files


def _quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic quantization: int8 weights per output channel, activations quantized at run time (per
    channel: on an init-model MiniLM span model it kept 54% of the spans exactly, against 36% per tensor)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()  # the tool logs a pre-processing hint at WARNING through the root logger
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        quiet.setLevel(level)


def _to_fp16(source: Path, target: Path) -> None:
    """ONNX Runtime's float16 conversion, keeping fp32 inputs and outputs (the runtime feeds float32 arrays)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(target))


def _check_tokenizer(model: Any, directory: Path) -> None:
    """The tokenizer the runtime loads (``AutoTokenizer`` on the directory) gives the model's ids."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(directory))
    own = model.processor.tokenizer
    probe = ["(", "[P]", "entities", "[E]", "person", ")", "[SEP_TEXT]", "alice"]
    if [loaded.convert_tokens_to_ids(t) for t in probe] != [own.convert_tokens_to_ids(t) for t in probe]:
        raise ConfigError(f"the tokenizer saved to {directory} does not give the model's token ids; not exportable")


def reference_extract(
    model: Any, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]], thresholds: Thresholds, batch_size: int
) -> list[dict[str, Any]]:
    """The torch model's extractions through gliner2's ``batch_extract`` at `thresholds`, with each span's
    confidence and character offsets (``include_confidence``, ``include_spans``)."""
    import torch
    from gliner2 import Schema

    built = [Schema.from_dict(thresholds.apply(schema)) for schema in schemas]
    with torch.no_grad():
        results: list[dict[str, Any]] = model.batch_extract(
            list(texts),
            built,
            batch_size=batch_size,
            threshold=thresholds.threshold,
            include_confidence=True,
            include_spans=True,
        )
    return results
