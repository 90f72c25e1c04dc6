"""Warnings a finished run's summary carries: a model whose validation F1 never rose above 0, and labels with gold
items that the exported model scores F1 0 on.

A run can complete every step, select a "best" model by an F1 of 0 and export it; that model extracts nothing the
validation records ask for. The summary then says so, with the likely causes, instead of exporting it silently. A
good micro F1 can also hide a label the model never gets right: every label with gold items whose F1 is 0 at the
exported thresholds (on the validation records) or on held-out records (:func:`zero_f1_labels`, which the demo and
``evaluate`` print) is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LABEL_ZERO_F1", "ZERO_F1", "label_warning", "run_warnings", "zero_f1_labels"]

ZERO_F1 = "zero_f1"
LABEL_ZERO_F1 = "label_zero_f1"


def run_warnings(
    history: Sequence[Mapping[str, Any]],
    *,
    architecture: str,
    threshold: float,
    thresholds: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """``{kind: message}``: :data:`ZERO_F1` for a run whose validations scored extraction and never saw an F1 above
    0 (at ``eval_threshold`` or at the fitted thresholds), :data:`LABEL_ZERO_F1` for labels with gold items that
    score 0 at the export's fitted `thresholds` (``Thresholds.to_dict()``, its ``details["labels"]``)."""
    out = _zero_f1(history, architecture=architecture, threshold=threshold)
    labels = (thresholds or {}).get("details", {}).get("labels") or {}
    silent = [f"{name} ({row['support']} gold, at {row['threshold']:g})" for name, row in labels.items() if _zero(row)]
    if silent and ZERO_F1 not in out:
        unfound = set((thresholds or {}).get("details", {}).get("unfound") or ())
        every = [name for name in labels if name in unfound]
        out[LABEL_ZERO_F1] = (
            f"label(s) with gold mentions score F1 0 on the validation records at the exported thresholds: "
            f"{', '.join(silent)}"
            + (f"; {', '.join(every)} at every threshold from 0.05 to 0.95" if every else "")
            + ". The model does not extract them: more epochs or data for them, or check their label confusion"
        )
    return out


def zero_f1_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``kind/label (n gold)`` for each per-label row (``ScoreReport.rows()``) with gold items and F1 0."""
    return [f"{row['kind']}/{row['label']} ({row['support']} gold)" for row in rows if _zero(row)]


def label_warning(rows: Sequence[Mapping[str, Any]], where: str) -> str | None:
    """One line naming the labels with gold items and F1 0 in `rows` (None when there are none)."""
    zero = zero_f1_labels(rows)
    return f"F1 0 on {where} for label(s) with gold mentions: {', '.join(zero)}" if zero else None


def _zero(row: Mapping[str, Any]) -> bool:
    return bool(row.get("support")) and float(row.get("f1", 0.0)) == 0.0


def _best_f1(entry: Mapping[str, Any]) -> float:
    values = [entry.get(key) for key in ("eval_f1", "eval_f1_fitted")]
    return max(float(v) for v in values if isinstance(v, (int, float)))


def _zero_f1(history: Sequence[Mapping[str, Any]], *, architecture: str, threshold: float) -> dict[str, str]:
    scored = [entry for entry in history if isinstance(entry.get("eval_f1"), (int, float))]
    if not scored or any(_best_f1(entry) > 0.0 for entry in scored):
        return {}
    causes = [
        f"the extraction threshold ({threshold:g}) is above every score the model gives: a short run's span scores "
        "often stay below 0.5 (try a lower eval_threshold, or evaluate the export with --threshold 0.1)",
        "too few updates or too low learning rates for the heads to learn the labels (more epochs, a higher task_lr)",
    ]
    if architecture == "span":
        causes.insert(
            1,
            "the span model's count head predicts 0 for every label, so it extracts nothing at any threshold "
            "(build the model with `prefect-gliner2 init-model`, or set repair_count_head: true)",
        )
    message = (
        f"validation F1 stayed 0 at all {len(scored)} validation(s): the exported model found none of the "
        "validation records' entities. Likely causes: " + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1))
    )
    return {ZERO_F1: message}
