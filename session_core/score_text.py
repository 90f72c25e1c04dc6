"""Scores in words for logs and terminals: a validation's F1s and label confusion in one line, and the per-label
table that ``evaluate`` and the demo print (precision, recall, F1, support, and how many false positives are another
label's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.run_warnings import label_warning

__all__ = ["label_confusion", "label_table", "validation_scores"]


def validation_scores(metrics: Mapping[str, Any]) -> str:
    """A validation's F1s: ``F1 0.9000 (macro 0.8000; P 0.9000, R 0.9000) at eval_threshold, 0.9500 (macro 0.9000)
    at the fitted thresholds; WARNING: F1 0 on this validation for label(s) with gold mentions: entities/day (27
    gold)`` (the label confusion, :func:`label_confusion`, and the warning at the fitted thresholds when measured); ""
    without extraction metrics."""
    if "eval_f1" not in metrics:
        return ""
    text = (
        f"F1 {metrics['eval_f1']:.4f} (macro {float(metrics.get('eval_macro_f1', 0.0)):.4f}; "
        f"P {metrics['eval_precision']:.4f}, R {metrics['eval_recall']:.4f}) at eval_threshold"
    )
    if "eval_f1_fitted" in metrics:
        text += (
            f", {metrics['eval_f1_fitted']:.4f} (macro {metrics['eval_macro_f1_fitted']:.4f}) at the fitted thresholds"
        )
    rows = metrics.get("per_label_fitted") or metrics.get("per_label") or []
    confused = label_confusion(rows)
    warning = label_warning(rows, "this validation")
    return text + (f"; {confused}" if confused else "") + (f"; WARNING: {warning}" if warning else "")


def label_confusion(rows: Sequence[Mapping[str, Any]]) -> str:
    """``false positives that are another label's gold mentions: entities/person 4 of 6 (company 4)`` for the labels
    (per-label rows of ``ScoreReport.rows()``) with any; "" when none has."""
    parts = []
    for row in rows:
        if row.get("confused"):
            others = ", ".join(f"{k} {n}" for k, n in (row.get("confused_with") or {}).items())
            name = f"{row['kind']}/{row['label']}"
            parts.append(f"{name} {row['confused']} of {row['fp']}" + (f" ({others})" if others else ""))
    return f"false positives that are another label's gold mentions: {', '.join(parts)}" if parts else ""


def label_table(rows: Sequence[Mapping[str, Any]], total: Mapping[str, Any], *, indent: str = "") -> list[str]:
    """Per-label precision, recall, F1, support and confusion (``confused``: false positives that are gold mentions
    of another label, by label), then the micro totals."""
    names = [f"{r['kind']}/{r['label']}" for r in rows]
    width = max([len(n) for n in names] + [len("all (micro)")])
    head = f"{'label':<{width}}  precision  recall      F1  support  fp that are another label's"

    def line(name: str, row: Mapping[str, Any]) -> str:
        cells = f"{row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:6.4f}  {row['support']:7d}"
        others = row.get("confused_with") or {}
        confused = f"  {row.get('confused', 0)}" + (
            f" ({', '.join(f'{k} {n}' for k, n in others.items())})" if others else ""
        )
        return f"{indent}{name:<{width}}  {cells}{confused if 'confused' in row else ''}".rstrip()

    lines = [indent + head, *(line(n, r) for n, r in zip(names, rows, strict=True)), indent + "-" * len(head)]
    return [*lines, line("all (micro)", total)]
