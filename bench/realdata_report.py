"""The tables bench/realdata.py prints: per trainer micro and macro F1 over seeds with the spread, and per label.

Torch-free. A run's scores are ``ScoreReport.to_dict()``-like dicts: ``{"micro": f1, "macro": f1, "labels": {label:
{"f1", "support", "precision", "recall", "tp", "fp", "fn", "confused"}}, "seconds": wall}``, where ``confused`` counts
the label's false positives that are gold mentions of another label; the spread over seeds is shown as mean
[min-max].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean
from typing import Any

__all__ = ["report_lines", "run_scores", "spread"]


def run_scores(report: Any, seconds: float, **extra: Any) -> dict[str, Any]:
    """The figures of one trainer's run from its held-out ``ScoreReport``."""
    rows = {row["label"]: row for row in report.rows()}
    labels = {
        label: {key: row[key] for key in ("f1", "precision", "recall", "support", "tp", "fp", "fn", "confused")}
        for label, row in rows.items()
    }
    return {
        "micro": report.metrics()["eval_f1"],
        "macro": report.macro_f1,
        "labels": labels,
        "seconds": seconds,
        **extra,
    }


def spread(values: Sequence[float]) -> str:
    """``mean [min-max]`` (one value: just the value)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{mean(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report_lines(runs: Mapping[str, Sequence[Mapping[str, Any]]], reference: str = "token classifier") -> list[str]:
    """Markdown tables: micro/macro/wall time per trainer, the micro ratio to `reference`, then F1 per label."""
    lines = [
        f"| trainer | seeds | held-out micro F1 | macro F1 | micro / {reference} | wall s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ref = runs.get(reference)
    for name, scores in runs.items():
        micro = [s["micro"] for s in scores]
        ratio = "-"
        if ref and name != reference:
            ratio = spread([m / r["micro"] if r["micro"] else 0.0 for m, r in zip(micro, ref, strict=False)])
        lines.append(
            f"| {name} | {len(scores)} | {spread(micro)} | {spread([s['macro'] for s in scores])} | {ratio} | "
            f"{mean(s['seconds'] for s in scores):.0f} |"
        )
    labels = list(dict.fromkeys(label for scores in runs.values() for s in scores for label in s["labels"]))
    lines += ["", "| trainer | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, scores in runs.items():
        cells = []
        for label in labels:
            f1s = [s["labels"][label]["f1"] for s in scores if label in s["labels"]]
            support = max((s["labels"][label]["support"] for s in scores if label in s["labels"]), default=0)
            cells.append(f"{spread(f1s)} (n={support})" if f1s else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| false positives (of them another label's mention) | " + " | ".join(labels) + " |"]
    lines.append("|---|" + "---:|" * len(labels))
    for name, scores in runs.items():
        cells = []
        for label in labels:
            found = [s["labels"][label] for s in scores if label in s["labels"]]
            fps, confused = [float(f["fp"]) for f in found], [f.get("confused") for f in found]
            known = f"{mean(float(c) for c in confused):.0f}" if None not in confused else "?"  # older JSON: not kept
            cells.append(f"{mean(fps):.0f} ({known})" if found else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
