"""A promotion decision for people: markdown (a Prefect artifact) and plain text (the CLI), the same content."""

from __future__ import annotations

from prefect_gliner2.session_core.bootstrap import Interval
from prefect_gliner2.session_core.promotion import PromotionDecision, SetComparison
from prefect_gliner2.session_core.promotion_rule import PromotionRule

__all__ = ["decision_markdown", "decision_text", "rule_words"]

Table = tuple[list[str], list[list[str]]]  # header, rows


def rule_words(rule: PromotionRule) -> str:
    """The rule that decided, in one paragraph."""
    level = f"{100 * rule.confidence:g}%"
    return (
        f"Promote when the lower bound of the {level} interval of (candidate F1 - current F1) on the test records is "
        f"above {rule.margin:g}. Reject when a label with {rule.min_support}+ gold items loses more than "
        f"{rule.max_label_drop:g} F1 and the whole interval of its difference lies below 0, when a label the current "
        f"model finds ({rule.min_vanish_support}+ gold items) falls to F1 0, or when the guard set's F1 drops the "
        f"same way by more than {rule.max_guard_drop:g}. Intervals: {rule.resamples} paired bootstrap resamples of "
        f"whole records ({rule.method}, seed {rule.seed})."
    )


def decision_markdown(decision: PromotionDecision) -> str:
    lines = [f"## Promotion: **{decision.verdict}**", ""]
    lines += [f"- {reason}" for reason in decision.reasons]
    for comparison in _sets(decision):
        lines += ["", f"### {comparison.name} ({comparison.records} records)", ""]
        lines += _markdown_table(_models_table(comparison, decision.rule.confidence))
        lines += [""] + _markdown_table(_labels_table(comparison, decision.rule.confidence))
    lines += ["", f"_Rule:_ {rule_words(decision.rule)}"]
    return "\n".join(lines) + "\n"


def decision_text(decision: PromotionDecision) -> str:
    lines = [f"promotion: {decision.verdict}"]
    lines += [f"  - {reason}" for reason in decision.reasons]
    for comparison in _sets(decision):
        lines += ["", f"{comparison.name} ({comparison.records} records)"]
        lines += _text_table(_models_table(comparison, decision.rule.confidence))
        lines += [""] + _text_table(_labels_table(comparison, decision.rule.confidence))
    lines += ["", f"rule: {rule_words(decision.rule)}"]
    return "\n".join(lines) + "\n"


def _sets(decision: PromotionDecision) -> list[SetComparison]:
    return [s for s in (decision.test, decision.guard) if s is not None]


def _models_table(comparison: SetComparison, confidence: float) -> Table:
    rows = [["candidate", *_cells(comparison.candidate)]]
    for name, value in (("current", comparison.current), ("base", comparison.base)):
        if value is not None:
            rows.append([name, *_cells(value)])
    if comparison.difference is not None:
        rows.append(["candidate - current", *_cells(comparison.difference, signed=True)])
    return ["model", "F1", f"{100 * confidence:g}% CI"], rows


def _labels_table(comparison: SetComparison, confidence: float) -> Table:
    header = ["label", "support", "base F1", "current F1", "candidate F1", "difference", f"{100 * confidence:g}% CI"]
    header.append("verdict")
    rows = []
    for label in comparison.labels:
        difference = _cells(label.difference, signed=True) if label.difference else ["", ""]
        rows.append(
            [
                f"{label.kind}/{label.label}",
                str(label.support),
                _number(label.base_f1),
                _number(label.current_f1),
                _number(label.candidate_f1),
                *difference,
                label.verdict,
            ]
        )
    return header, rows


def _cells(interval: Interval, signed: bool = False) -> list[str]:
    form = "{:+.4f}" if signed else "{:.4f}"
    bounds = f"[{form.format(interval.low)}, {form.format(interval.high)}]"
    return [form.format(interval.estimate), bounds]


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _markdown_table(table: Table) -> list[str]:
    header, rows = table
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _text_table(table: Table) -> list[str]:
    header, rows = table
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
