"""Extraction thresholds that travel with a model: a global value and per-label values, recorded in export.json.

A trained model's thresholds are fitted on its validation data (see the fitting code) and written into its
``export.json`` under :data:`THRESHOLDS_KEY`. Every inference the product runs (``evaluate``, retraining's
comparison, ``extract``) reads them with :func:`read_thresholds` and asks gliner2 with :meth:`Thresholds.apply`:
gliner2 takes one ``threshold`` argument per call, but a schema's per-label ``threshold`` wins over it, so per-label
values go into the schema. A threshold the user passes explicitly replaces all of them (:func:`fixed`).

Torch-free: the export's marker file is read with fsspec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.layout import EXPORT_MARKER_FILE
from prefect_gliner2.session_core.storage import resolve

__all__ = [
    "DEFAULT_THRESHOLD",
    "THRESHOLDS_KEY",
    "Thresholds",
    "check_threshold",
    "describe",
    "fixed",
    "read_thresholds",
]

DEFAULT_THRESHOLD = 0.5  # gliner2's own default
THRESHOLDS_KEY = "thresholds"  # the key in export.json
KINDS = ("entities", "relations", "fields")  # fields: "structure.field"


def check_threshold(value: Any, what: str = "threshold") -> float:
    """`value` as a float in [0, 1], else a ConfigError that says what was given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{what} must be in [0, 1], got {value}")
    return float(value)


@dataclass(frozen=True)
class Thresholds:
    """The thresholds to extract with: `threshold` for every label without its own value, and per-label values by
    kind (``entities`` label, ``relations`` type, ``fields`` as ``"structure.field"``). `fitted` says whether they
    were fitted on validation data; `details` records how (records, step, F1 at the fitted and default values)."""

    threshold: float = DEFAULT_THRESHOLD
    entities: Mapping[str, float] = field(default_factory=dict)
    relations: Mapping[str, float] = field(default_factory=dict)
    fields: Mapping[str, float] = field(default_factory=dict)
    fitted: bool = False
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_threshold(self.threshold)
        for kind in KINDS:
            for label, value in getattr(self, kind).items():
                check_threshold(value, f"threshold of {kind} {label!r}")

    def for_label(self, kind: str, label: str) -> float:
        """The threshold gliner2 applies to `label` of `kind` (entities, relations or fields)."""
        values: Mapping[str, float] = getattr(self, kind)
        return float(values.get(label, self.threshold))

    def apply(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of a ``Schema.from_dict`` schema with the per-label thresholds written into it (labels without
        their own value keep the call's `threshold`)."""
        out = dict(schema)
        for kind, values in (("entities", self.entities), ("relations", self.relations)):
            if kind in out and values:
                out[kind] = _with_thresholds(out[kind], values)
        if "structures" in out and self.fields:
            out["structures"] = {
                name: _structure_with_thresholds(name, spec, self.fields) for name, spec in out["structures"].items()
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "entities": dict(self.entities),
            "relations": dict(self.relations),
            "fields": dict(self.fields),
            "fitted": self.fitted,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        if not isinstance(data, Mapping):
            raise ConfigError(f"thresholds must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"threshold", "entities", "relations", "fields", "fitted", "details"})
        if unknown:
            raise ConfigError(f"unknown threshold keys {unknown}; expected threshold, entities, relations, fields")
        return cls(
            threshold=float(data.get("threshold", DEFAULT_THRESHOLD)),
            entities=dict(data.get("entities") or {}),
            relations=dict(data.get("relations") or {}),
            fields=dict(data.get("fields") or {}),
            fitted=bool(data.get("fitted", False)),
            details=dict(data.get("details") or {}),
        )


def describe(recorded: Mapping[str, Any] | Thresholds | None) -> str:
    """Fitted thresholds in one line, with the F1 they buy: ``thresholds 0.3 (entities city 0.65), fitted on 21
    validation records: micro F1 0.9756 (macro 0.9750) vs 0.4878 (macro 0.3333) at 0.5``, then the labels with
    gold items that score 0 at every threshold; ``thresholds: gliner2's default 0.5`` without any."""
    if recorded is None:
        return f"thresholds: gliner2's default {DEFAULT_THRESHOLD} (none fitted: no validation extraction)"
    t = recorded if isinstance(recorded, Thresholds) else Thresholds.from_dict(recorded)
    own = [f"{kind} {label} {value:g}" for kind in KINDS for label, value in sorted(getattr(t, kind).items())]
    text = f"thresholds {t.threshold:g}" + (f" ({', '.join(own)})" if own else "")
    d = t.details
    if t.fitted and "f1" in d:
        text += (
            f", fitted on {d.get('records')} validation records: micro F1 {float(d['f1']):.4f}{_macro(d, '')} vs "
            f"{float(d.get('f1_default', 0.0)):.4f}{_macro(d, '_default')} at {DEFAULT_THRESHOLD}"
        )
        support = d.get("support") or {}
        unfound = [f"{name} ({support.get(name, '?')} gold)" for name in d.get("unfound") or ()]
        if unfound:
            text += f"; F1 0 at every threshold: {', '.join(unfound)}"
    return text


def _macro(details: Mapping[str, Any], suffix: str) -> str:
    value = details.get(f"macro_f1{suffix}")
    return f" (macro {float(value):.4f})" if isinstance(value, (int, float)) else ""


def fixed(threshold: float) -> Thresholds:
    """One threshold for every label (a user's explicit choice, or gliner2's default 0.5)."""
    return Thresholds(threshold=check_threshold(threshold))


def read_thresholds(export_uri: str) -> Thresholds | None:
    """The thresholds recorded in an export's ``export.json``; None when the export records none (an older export,
    a native gliner2 model directory without export.json)."""
    fs, path = resolve(export_uri)
    marker = f"{path.rstrip('/')}/{EXPORT_MARKER_FILE}"
    if not fs.exists(marker):
        return None
    with fs.open(marker, "rb") as handle:
        info = json.loads(handle.read().decode("utf-8"))
    recorded = info.get(THRESHOLDS_KEY) if isinstance(info, Mapping) else None
    return None if recorded is None else Thresholds.from_dict(recorded)


def _with_thresholds(labels: Any, values: Mapping[str, float]) -> dict[str, Any]:
    """Entities/relations in any of gliner2's forms (list, label -> description, label -> config) as label ->
    config with the label's threshold."""
    if isinstance(labels, Mapping):
        items = list(labels.items())
    else:
        items = [(label, None) for label in labels]
    out: dict[str, Any] = {}
    for label, spec in items:
        config: dict[str, Any] = {}
        if isinstance(spec, str) and spec:
            config["description"] = spec
        elif isinstance(spec, Mapping):
            config.update(spec)
        if label in values:
            config["threshold"] = float(values[label])
        out[label] = config
    return out


def _structure_with_thresholds(name: str, spec: Mapping[str, Any], values: Mapping[str, float]) -> dict[str, Any]:
    fields_out = []
    for entry in spec.get("fields") or []:
        entry = dict(entry)
        key = f"{name}.{entry.get('name')}"
        if key in values:
            entry["threshold"] = float(values[key])
        fields_out.append(entry)
    return {**spec, "fields": fields_out}
