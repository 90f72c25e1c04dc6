"""Validation of a live session: gliner2's native eval losses and, from its own batched inference, extraction scores.

Torch-free: the session and the extractors are passed in (``training.inference.model_extractor`` wraps a loaded
model). The managed driver's validation points and held-out scoring of models (`runtime/compare.py`: retraining's
comparison and `prefect-gliner2 compare`) extract and score with the same functions here, so a candidate's
held-out score is computed like its validation history. Both parts draw no RNG and leave modes and gradients
untouched (see `TrainingSession.forward` and `TrainingSession.extract`), so validating never changes training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.fitted_scores import fitted_validation
from prefect_gliner2.session_core.label_order import CANONICAL, SHUFFLED, extraction_schemas
from prefect_gliner2.session_core.metrics import LOSS_SOURCES
from prefect_gliner2.session_core.scoring import DatasetSchema, ScoreReport, score_records
from prefect_gliner2.session_core.thresholds import Thresholds, fixed

__all__ = [
    "PER_LABEL_KEY",
    "evaluate_session",
    "extraction_schemas",
    "native_losses",
    "label_f1_order_min",
    "order_metrics",
    "order_reports",
    "order_robustness",
    "score_extraction",
]

PER_LABEL_KEY = "per_label"  # the per-label rows inside a validation metrics entry
Pair = tuple[str, dict[str, Any]]
Extract = Callable[[list[str], list[dict[str, Any]]], list[dict[str, Any]]]


def native_losses(session: Any, batches: Sequence[Sequence[Pair]]) -> dict[str, float]:
    """gliner2's eval-mode losses, averaged over the batches (``eval_loss`` and its components)."""
    totals = dict.fromkeys(LOSS_SOURCES, 0.0)
    for batch in batches:
        losses = session.forward(batch, return_components=True)
        for key, source in LOSS_SOURCES.items():
            totals[key] += losses[source]
    return {key: value / len(batches) for key, value in totals.items()}


def score_extraction(
    pairs: Sequence[Pair],
    extract: Extract,
    *,
    label_order: str = SHUFFLED,
    seed: int = 0,
    trial: int = 0,
    per_record: bool = False,
) -> ScoreReport:
    """Extract every record's text with the data set's schema (one batched call) and score it against its gold.

    ``label_order``: ``"shuffled"`` (the default) asks each record's labels in its own seeded random order
    (``label_order.shuffle_schema`` with the record's position, `seed` and `trial`), as a user's code would;
    ``"canonical"`` asks them in the data set's own order, the order training records list them. ``per_record``
    keeps each record's counts (``ScoreReport.per_record``, what a paired bootstrap resamples)."""
    outputs: list[Mapping[str, Any]] = [output for _, output in pairs]
    schemas = extraction_schemas(outputs, label_order=label_order, seed=seed, trial=trial)
    predictions = extract([text for text, _ in pairs], schemas)
    return score_records(outputs, predictions, DatasetSchema.of(outputs), per_record=per_record)


def order_robustness(
    pairs: Sequence[Pair], extract: Extract, *, seed: int, trials: int
) -> tuple[ScoreReport, dict[str, float]]:
    """The report under the default shuffled order (trial 0), and the order metrics (metrics.ORDER_KEYS): micro F1
    in the canonical order, lowest and highest micro F1 over `trials` seeded orders."""
    reports, canonical = order_reports(pairs, extract, seed=seed, trials=trials)
    return reports[0], order_metrics(reports, canonical)


def order_metrics(reports: Sequence[ScoreReport], canonical: ScoreReport) -> dict[str, float]:
    """The order metrics (metrics.ORDER_KEYS) of :func:`order_reports`' reports."""
    f1s = [report.metrics()["eval_f1"] for report in reports]
    return {
        "eval_f1_canonical": canonical.metrics()["eval_f1"],
        "eval_f1_order_min": min(f1s),
        "eval_f1_order_max": max(f1s),
    }


def order_reports(
    pairs: Sequence[Pair], extract: Extract, *, seed: int, trials: int
) -> tuple[list[ScoreReport], ScoreReport]:
    """The reports under `trials` seeded random label orders (trial 0 first) and under the canonical order."""
    reports = [score_extraction(pairs, extract, seed=seed, trial=t) for t in range(max(1, trials))]
    return reports, score_extraction(pairs, extract, label_order=CANONICAL)


def label_f1_order_min(reports: Sequence[ScoreReport]) -> dict[str, float]:
    """Each label's lowest F1 over the reports (``kind/label``: F1), for labels with gold items: what a user who
    asks the labels in the worst of those orders gets for that label."""
    lowest: dict[str, float] = {}
    for report in reports:
        for row in report.rows():
            if row["support"]:
                name = f"{row['kind']}/{row['label']}"
                lowest[name] = min(lowest.get(name, 1.0), float(row["f1"]))
    return lowest


def evaluate_session(
    session: Any,
    batches: Sequence[Sequence[Pair]],
    *,
    extraction: bool,
    threshold: float | Thresholds,
    seed: int = 0,
    label_order_trials: int = 1,
) -> dict[str, Any]:
    """The validation metrics of the live model: losses, then (with `extraction`) P/R/F1 under seeded shuffled label
    orders, the order metrics and the per-label rows (see :func:`order_robustness`), and the scores at thresholds
    fitted on one more extraction at the fit's floor (``fitted_scores.fitted_validation``: what the export ships).
    `threshold`: one value for every label, or a model's :class:`Thresholds` (per-label values written into each
    schema)."""
    chosen = threshold if isinstance(threshold, Thresholds) else fixed(threshold)
    metrics: dict[str, Any] = dict(native_losses(session, batches))
    if extraction:
        pairs = [pair for batch in batches for pair in batch]
        size = max((len(batch) for batch in batches), default=1)

        def extract(texts: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
            applied = [chosen.apply(schema) for schema in schemas]
            return session.extract(texts, applied, threshold=chosen.threshold, batch_size=size)

        def extract_floor(texts: list[str], schemas: list[dict[str, Any]], floor: float) -> list[dict[str, Any]]:
            return session.extract(texts, schemas, threshold=floor, batch_size=size, include_confidence=True)

        report, order = order_robustness(pairs, extract, seed=seed, trials=label_order_trials)
        metrics.update(report.metrics())
        metrics.update(order)
        metrics[PER_LABEL_KEY] = report.rows()
        metrics.update(fitted_validation(pairs, extract_floor, seed=seed))
    return metrics
