"""A run's training curves: loss, learning rate and validation F1 (micro, macro, per label) against optimizer steps,
as a markdown artifact of SVG charts (``gliner2-<run key>-curves``, flows/reporting.py updates it in place).

The points are what the run records anyway: the worker's per-update metrics (``AdvanceResult.updates``) and its
validation history. A resumed run starts from the history its restored checkpoint recorded (the worker sends it), so the
curves of a run that crashed and resumed are the whole run's, each step once (the replayed steps are the same,
bit for bit, and replace their earlier points).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from prefect_gliner2.flows.report_text import rounded
from prefect_gliner2.flows.svg_chart import Series, data_uri, line_chart

__all__ = ["Curves", "TrainPoint", "label_name"]

logger = logging.getLogger(__name__)
TrainPoint = tuple[int, float | None, float | None]  # step, loss, learning rate
FITTED = "eval_f1_fitted"
MACRO = {FITTED: "eval_macro_f1_fitted", "eval_f1": "eval_macro_f1"}
SERIES = (  # validation key, series name, line width
    (FITTED, "micro F1 (fitted)", 2.5),
    ("eval_macro_f1_fitted", "macro F1 (fitted)", 2.5),
    ("eval_f1", "micro F1 at eval_threshold", 1.5),
    ("eval_macro_f1", "macro F1 at eval_threshold", 1.5),
)


def label_name(row: dict[str, Any]) -> str:
    """A per-label row's display name: the entity label, else ``kind/label``."""
    return str(row["label"]) if row.get("kind") == "entities" else f"{row.get('kind')}/{row['label']}"


class Curves:
    """The points of one run's curves, keyed by step (a replayed step replaces its point)."""

    def __init__(self) -> None:
        self.train: dict[int, TrainPoint] = {}

    def add(self, updates: Iterable[dict[str, Any]]) -> None:
        """Record update metrics (entries of the worker's training history: ``step``, ``loss``,
        ``learning_rate``)."""
        for entry in updates:
            step = int(entry["step"])
            self.train[step] = (step, _number(entry.get("loss")), _number(entry.get("learning_rate")))

    def points(self) -> list[TrainPoint]:
        """The recorded points in step order (a copy: safe to hand to another thread)."""
        return [self.train[step] for step in sorted(self.train)]


def curves_markdown(
    run_key: str, points: Sequence[TrainPoint], validations: Sequence[dict[str, Any]], max_steps: int | None = None
) -> str:
    """The curves artifact: a line of where the run is, then the loss, learning-rate and validation-F1 charts."""
    lines = [f"# Training curves of `{run_key}`", "", _headline(points, validations, max_steps), ""]
    steps = (0.0, float(max_steps)) if max_steps else None  # the axis spans the whole run as it grows
    loss = [Series("training loss", [(s, v) for s, v, _ in points if v is not None])]
    eval_loss = [(v["step"], v["eval_loss"]) for v in validations if v.get("eval_loss") is not None]
    if eval_loss:
        loss.append(Series("validation loss", eval_loss, width=2.0))
    if points:
        lines.append(_image("loss", line_chart(loss, title="Loss", y_label="loss", x_range=steps)))
        rate = [Series("learning rate", [(s, v) for s, _, v in points if v is not None])]
        lines.append(
            _image("learning rate", line_chart(rate, title="Learning rate", y_label="learning rate", x_range=steps))
        )
    f1 = _f1_series(validations)
    if f1:
        title = "Validation F1 (micro, macro and per label)"
        chart = line_chart(f1, title=title, y_label="F1", x_range=steps, y_range=(0.0, 1.0))
        lines.append(_image("validation F1", chart))
    elif not points:
        lines.append("_No training step recorded yet._")
    return "\n\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


def _headline(points: Sequence[TrainPoint], validations: Sequence[dict[str, Any]], max_steps: int | None) -> str:
    parts = []
    if points:
        step, loss, rate = points[-1]
        parts.append(f"step **{step}**" + (f" of {max_steps}" if max_steps else ""))
        if loss is not None:
            parts.append(f"loss **{rounded(loss, 4):g}**")
        if rate is not None:
            parts.append(f"learning rate **{rounded(rate, 3):g}**")
    scored = [v for v in validations if v.get("eval_f1") is not None]
    if scored:
        key = FITTED if FITTED in scored[-1] else "eval_f1"
        best = max(scored, key=lambda v: float(v.get(key, v["eval_f1"])))
        where = " at the fitted thresholds" if key == FITTED else ""
        parts.append(
            f"validation F1{where} **{float(scored[-1][key]):.3f}** (macro "
            f"{float(scored[-1].get(MACRO[key], 0.0)):.3f}; best {float(best.get(key, best['eval_f1'])):.3f} at "
            f"step {best.get('step')})"
        )
    parts.append(f"{len(points)} training point(s), {len(validations)} validation(s)")
    return " · ".join(parts)


def _f1_series(validations: Sequence[dict[str, Any]]) -> list[Series]:
    """Micro and macro F1 at the fitted thresholds (what the export ships) and at eval_threshold, then each label's F1
    (at the fitted thresholds when measured)."""
    scored = [v for v in validations if v.get("eval_f1") is not None]
    if not scored:
        return []
    series = []
    for key, name, width in SERIES:
        values = [(v["step"], float(v[key])) for v in scored if isinstance(v.get(key), (int, float))]
        if values:
            series.append(Series(name, values, width=width))
    per_label: dict[str, list[tuple[float, float]]] = {}
    for entry in scored:
        for row in entry.get("per_label_fitted") or entry.get("per_label") or []:
            per_label.setdefault(label_name(row), []).append((entry["step"], float(row["f1"])))
    series += [Series(name, values) for name, values in per_label.items()]
    return series


def _image(alt: str, svg: str) -> str:
    return f"![{alt}]({data_uri(svg)})"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
