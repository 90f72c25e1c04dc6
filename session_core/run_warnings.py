"""Warnings a finished run's summary carries: a model whose validation F1 never rose above 0.

A run can complete every step, select a "best" model by an F1 of 0 and export it; that model extracts nothing the
validation records ask for. The summary then says so, with the likely causes, instead of exporting it silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ZERO_F1", "run_warnings"]

ZERO_F1 = "zero_f1"


def run_warnings(history: Sequence[Mapping[str, Any]], *, architecture: str, threshold: float) -> dict[str, str]:
    """``{kind: message}`` for a run whose validations scored extraction and never saw an F1 above 0."""
    scored = [entry for entry in history if isinstance(entry.get("eval_f1"), (int, float))]
    if not scored or any(float(entry["eval_f1"]) > 0.0 for entry in scored):
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
