"""What an ONNX export and the gliner2-onnx runtime cover, decided before any work: which models, which schemas,
and in words why the rest is refused (torch-free).

gliner2-onnx 0.1 runs a span model's named-entity extraction and a single-task classification. What the product
exports and extracts through it:

- span models (``"architecture": "span"`` in config.json); a boundary model decodes with start/end heads and a
  proposal pipeline the runtime does not have;
- entity tasks asked with plain labels (a list, or label -> "" / a per-label threshold), at per-label thresholds.

Refused, with the reason: relations and structures (the runtime has no decoder for them), classification tasks
(the runtime prompts every classification as a task named ``category`` in an encoder pass of its own, while
gliner2 prompts the task's own name in the same pass as the record's other tasks: other hidden states, other
scores), entity descriptions and per-label settings other than a threshold (the runtime's prompt holds labels only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError

__all__ = [
    "PRECISIONS",
    "RUNTIMES",
    "RUNTIME_ONNX",
    "RUNTIME_TORCH",
    "architecture_reason",
    "check_schema",
    "entity_thresholds",
    "schema_reasons",
]

RUNTIME_TORCH = "torch"  # gliner2's own batch_extract on the torch model (the default)
RUNTIME_ONNX = "onnx"  # the exported graphs, through the gliner2-onnx runtime
RUNTIMES = (RUNTIME_TORCH, RUNTIME_ONNX)
PRECISIONS = ("fp32", "fp16", "int8")  # what an export can hold: fp32 graphs, and fp16 / int8 graphs derived from them

_TASK_REASONS = {
    "relations": "relation extraction (gliner2-onnx has no relation decoder; it runs entities and classification)",
    "structures": "structures (gliner2-onnx has no structure decoder; it runs entities and classification)",
    "json_structures": "structures (gliner2-onnx has no structure decoder; it runs entities and classification)",
    "classifications": (
        "classification tasks (gliner2-onnx prompts every classification as a task named 'category' in an encoder "
        "pass of its own; gliner2 prompts the task's own name in one pass with the record's other tasks, so the "
        "runtime's scores are not the model's)"
    ),
}


def architecture_reason(config: Mapping[str, Any]) -> str | None:
    """Why a model with this config.json cannot be exported (None when its architecture can)."""
    architecture = str(config.get("architecture") or "span")
    if architecture == "span":
        return None
    return (
        f"a {architecture} model: gliner2-onnx implements the span architecture only (a boundary model decodes with "
        "start/end heads and a proposal pipeline the runtime does not have)"
    )


def schema_reasons(schema: Mapping[str, Any]) -> list[str]:
    """What in a ``Schema.from_dict`` schema (per-label thresholds written in) the ONNX runtime cannot ask."""
    reasons = [_TASK_REASONS.get(key, f"schema key {key!r}") for key in schema if key != "entities"]
    entities = schema.get("entities")
    if entities is None:
        reasons.append("no entity task (the ONNX runtime extracts entities only)")
    elif isinstance(entities, Mapping):
        for label, spec in entities.items():
            if isinstance(spec, str) and spec:
                reasons.append(f"the description of entity {label!r} (the runtime's prompt holds labels only)")
            elif isinstance(spec, Mapping) and set(spec) - {"threshold", "description"}:
                extra = sorted(set(spec) - {"threshold", "description"})
                reasons.append(f"entity {label!r} settings {extra} (only a threshold can be asked of the runtime)")
            elif isinstance(spec, Mapping) and spec.get("description"):
                reasons.append(f"the description of entity {label!r} (the runtime's prompt holds labels only)")
            elif spec is not None and not isinstance(spec, (str, Mapping)):
                reasons.append(f"entity {label!r} given as {type(spec).__name__}")
    elif not isinstance(entities, list) or not all(isinstance(label, str) for label in entities):
        reasons.append(f"entities given as {type(entities).__name__} (expected a list of labels)")
    return reasons


def check_schema(schema: Mapping[str, Any], where: str) -> None:
    """A ConfigError naming `where` and every reason, when the ONNX runtime cannot ask `schema`."""
    reasons = schema_reasons(schema)
    if reasons:
        raise ConfigError(
            f"{where}: the ONNX runtime cannot extract {'; '.join(reasons)}. Extract with the torch runtime "
            "(--runtime torch) or ask entity labels only"
        )


def entity_thresholds(schema: Mapping[str, Any], default: float) -> dict[str, float]:
    """Each entity label of a checked schema with the threshold gliner2 applies to it (its own, else `default`), in
    the schema's order."""
    entities = schema["entities"]
    if isinstance(entities, Mapping):
        return {
            str(label): float(spec["threshold"]) if isinstance(spec, Mapping) and "threshold" in spec else default
            for label, spec in entities.items()
        }
    return {str(label): default for label in entities}
