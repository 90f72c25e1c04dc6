"""Validation at fitted thresholds: fit on one extraction at the fit's floor, then score the records at the fit.

What a run exports is the model with thresholds fitted on its validation records (``export.json``), so that is what
best selection should judge. Each validation extracts its records once more, at :data:`~.threshold_table.FLOOR`
with confidences, each record's labels in its seeded shuffled order (trial 0, as the fit at export does), fits the
thresholds on that extraction (:mod:`.threshold_fit`, torch-free) and scores the same extraction at them. A best
model's validation entry therefore names exactly the thresholds and scores its export records.

Keys added to a validation entry: ``eval_f1_fitted`` and ``eval_macro_f1_fitted`` (:data:`.metrics.FITTED_KEYS`),
``per_label_fitted`` (the per-label rows at the fitted values, each with its ``threshold``) and
``thresholds_fitted`` (the values: ``threshold``, ``entities``, ``relations``, ``fields``; and ``unfound``, the
labels with gold items that score 0 at every candidate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.label_order import SHUFFLED, extraction_schemas
from prefect_gliner2.session_core.scoring import DatasetSchema, ScoreReport, score_records
from prefect_gliner2.session_core.threshold_fit import ExtractWithConfidence, fit_thresholds
from prefect_gliner2.session_core.threshold_table import FLOOR, KIND_OF, with_threshold
from prefect_gliner2.session_core.thresholds import Thresholds

__all__ = ["FITTED_ROWS_KEY", "FITTED_THRESHOLDS_KEY", "fitted_metrics", "fitted_validation", "score_at"]

FITTED_ROWS_KEY = "per_label_fitted"
FITTED_THRESHOLDS_KEY = "thresholds_fitted"


def fitted_validation(
    pairs: Sequence[tuple[str, Mapping[str, Any]]], extract: ExtractWithConfidence, *, seed: int
) -> dict[str, Any]:
    """Extract the (text, gold output) `pairs` once at the floor with confidences (`extract(texts, schemas,
    threshold)`), fit thresholds on it and score it at them: the keys of the module docstring."""
    outputs = [output for _, output in pairs]
    schemas = extraction_schemas(outputs, label_order=SHUFFLED, seed=seed)
    predictions = extract([text for text, _ in pairs], schemas, FLOOR)
    return fitted_metrics(outputs, predictions)


def fitted_metrics(gold: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fitted keys for gold outputs and their floor extractions with confidences."""
    fitted = fit_thresholds(gold, predictions)
    report = score_at(gold, predictions, fitted)
    rows = [{**row, "threshold": _threshold(fitted, row["kind"], row["label"])} for row in report.rows()]
    return {
        "eval_f1_fitted": report.total().f1,
        "eval_macro_f1_fitted": report.macro_f1,
        FITTED_ROWS_KEY: rows,
        FITTED_THRESHOLDS_KEY: {
            "threshold": fitted.threshold,
            **{kind: dict(getattr(fitted, kind)) for kind in KIND_OF.values()},
            "unfound": list(fitted.details["unfound"]),
        },
    }


def score_at(
    gold: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]], thresholds: Thresholds
) -> ScoreReport:
    """Gold outputs scored against floor extractions cut at `thresholds` (``threshold_table.with_threshold``)."""
    dataset = DatasetSchema.of(gold)
    structures = list(dataset.structures)
    return score_records(gold, [with_threshold(p, thresholds, structures) for p in predictions], dataset)


def _threshold(thresholds: Thresholds, kind: str, label: str) -> float | None:
    """The value a row's label is extracted with; None for classifications (no span threshold)."""
    return thresholds.for_label(KIND_OF[kind], label) if kind in KIND_OF else None
