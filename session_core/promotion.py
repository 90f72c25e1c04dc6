"""Whether a candidate model replaces the current one: paired F1 intervals, per-label and guard-set rules, in words.

    rule = PromotionRule(margin=0.0, confidence=0.95, resamples=2000, seed=0)
    decision = decide_promotion(ScoredSet("test_data", candidate_counts, current_counts, base_counts),
                                guard=ScoredSet("guard_data", candidate_guard, current_guard), rule=rule)
    decision.promote, decision.reasons, decision.to_dict()  # for people: promotion_report.decision_markdown(decision)

The rule, every interval from one seeded paired bootstrap over whole records (:mod:`.bootstrap`) per set of
records, at the rule's ``confidence``:

1. Better beyond noise: on the test records the lower bound of the interval of (candidate F1 - current F1), micro
   F1 over every label, must be above ``margin``.
2. No label lost: on each set, a label with at least ``min_support`` gold items *regresses* when its F1 drops by
   more than ``max_label_drop`` (point estimate) and the whole interval of its difference lies below 0 (the drop
   is not sampling noise). A small drop, or one whose interval reaches 0, does not reject; at 95% a label that did
   not change is flagged at most 2.5% of the time. A label with at least ``min_vanish_support`` gold items that the
   current model finds (F1 > 0) *vanishes* when the candidate's F1 on it is 0; that rejects whatever the interval.
3. No forgetting on the guard set (optional: e.g. the data the current model was trained on): its micro F1 may not
   regress by more than ``max_guard_drop`` in the sense of rule 2, and rule 2 holds for its labels.

With no current model the candidate is promoted (the scores are still shown). The base model's F1 sits beside
both, to show what fine-tuning gained or forgot. Pure Python with numpy/scipy loaded inside the bootstrap only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from prefect_gliner2.session_core.bootstrap import Interval, bootstrap_f1
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.promotion_rule import PromotionRule
from prefect_gliner2.session_core.record_counts import RecordCounts

__all__ = [
    "LABEL_VERDICTS",
    "LabelComparison",
    "PromotionDecision",
    "PromotionRule",
    "ScoredSet",
    "SetComparison",
    "decide_promotion",
]

OK, REGRESSED, VANISHED, LOW_SUPPORT, NO_GOLD, NOT_COMPARED = (
    "ok",
    "regressed",
    "vanished",
    "low support",
    "no gold",
    "not compared",
)
LABEL_VERDICTS = (OK, REGRESSED, VANISHED, LOW_SUPPORT, NO_GOLD, NOT_COMPARED)
DECISION_FORMAT = 1  # the schema version of PromotionDecision.to_dict


@dataclass(frozen=True)
class ScoredSet:
    """The per-record counts of the candidate, the current model and the base model on one set of records."""

    name: str
    candidate: RecordCounts
    current: RecordCounts | None = None
    base: RecordCounts | None = None


@dataclass(frozen=True)
class LabelComparison:
    """One label on one set: support, each model's F1, the paired difference and the verdict (LABEL_VERDICTS)."""

    kind: str
    label: str
    support: int
    candidate_f1: float
    current_f1: float | None
    base_f1: float | None
    difference: Interval | None  # candidate - current
    verdict: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["difference"] = self.difference.to_dict() if self.difference else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LabelComparison:
        values = dict(data)
        values["difference"] = Interval.from_dict(data["difference"]) if data.get("difference") else None
        return cls(**values)


@dataclass(frozen=True)
class SetComparison:
    """Both models on one set: micro F1 intervals, the difference's interval, the label table and the set's result
    (``passed`` None when there was no current model to compare with)."""

    name: str
    records: int
    candidate: Interval
    current: Interval | None
    base: Interval | None
    difference: Interval | None
    labels: tuple[LabelComparison, ...]
    passed: bool | None
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        def interval(value: Interval | None) -> dict[str, float] | None:
            return value.to_dict() if value else None

        return {
            "name": self.name,
            "records": self.records,
            "candidate": self.candidate.to_dict(),
            "current": interval(self.current),
            "base": interval(self.base),
            "difference": interval(self.difference),
            "labels": [label.to_dict() for label in self.labels],
            "passed": self.passed,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SetComparison:
        def interval(key: str) -> Interval | None:
            return Interval.from_dict(data[key]) if data.get(key) else None

        return cls(
            name=str(data["name"]),
            records=int(data["records"]),
            candidate=Interval.from_dict(data["candidate"]),
            current=interval("current"),
            base=interval("base"),
            difference=interval("difference"),
            labels=tuple(LabelComparison.from_dict(label) for label in data["labels"]),
            passed=data["passed"],
            reasons=tuple(data["reasons"]),
        )


@dataclass(frozen=True)
class PromotionDecision:
    """The verdict, its reasons in words, the rule that decided and the numbers it decided on (JSON-ready)."""

    promote: bool
    reasons: tuple[str, ...]
    rule: PromotionRule
    test: SetComparison
    guard: SetComparison | None = None

    @property
    def verdict(self) -> str:
        return "promoted" if self.promote else "rejected"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": DECISION_FORMAT,
            "verdict": self.verdict,
            "promote": self.promote,
            "reasons": list(self.reasons),
            "rule": self.rule.to_dict(),
            "test": self.test.to_dict(),
            "guard": self.guard.to_dict() if self.guard else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromotionDecision:
        if not isinstance(data, Mapping) or data.get("format") != DECISION_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(
                f"a promotion decision must be a PromotionDecision.to_dict() of format "
                f"{DECISION_FORMAT}, got format {got!r}"
            )
        return cls(
            promote=bool(data["promote"]),
            reasons=tuple(data["reasons"]),
            rule=PromotionRule.from_dict(data["rule"]),
            test=SetComparison.from_dict(data["test"]),
            guard=SetComparison.from_dict(data["guard"]) if data.get("guard") else None,
        )


def decide_promotion(
    test: ScoredSet, *, guard: ScoredSet | None = None, rule: PromotionRule | None = None
) -> PromotionDecision:
    """Apply the rule (module docstring) to the candidate's and current model's counts on the test records and,
    when given, on the guard records. Raises RecordError when two models were not scored on the same records."""
    rule = rule if rule is not None else PromotionRule()
    if guard is not None and (guard.current is None) != (test.current is None):
        raise ConfigError("give the current model's guard-set counts exactly when you give its test-set counts")
    tested = _compare(test, rule, role="test")
    guarded = _compare(guard, rule, role="guard") if guard is not None else None
    if test.current is None:
        first = f"there is no current model: the first candidate is promoted ({_f1_words(tested)})"
        return PromotionDecision(True, (first,), rule, tested, guarded)
    judged = [s for s in (tested, guarded) if s is not None]
    failed = [s for s in judged if not s.passed]
    reasons = tuple(reason for s in (failed or judged) for reason in s.reasons)  # a rejection gives only its causes
    return PromotionDecision(not failed, reasons, rule, tested, guarded)


def _compare(scored: ScoredSet, rule: PromotionRule, *, role: str) -> SetComparison:
    """Score one set: align the tables, bootstrap once, judge the labels and the set as a whole."""
    candidate = scored.candidate
    current = candidate.check_same_records(scored.current, f"{scored.name}: current model") if scored.current else None
    base = candidate.check_same_records(scored.base, f"{scored.name}: base model") if scored.base else None
    tables = [candidate, *(t for t in (current, base) if t is not None)]
    pairs = [(0, 1)] if current is not None else []
    result = bootstrap_f1(
        tables, pairs=pairs, confidence=rule.confidence, resamples=rule.resamples, seed=rule.seed, method=rule.method
    )
    base_at = len(tables) - 1 if base is not None else None
    totals = candidate.label_totals()
    labels = tuple(
        _judge_label(
            key,
            totals[key].support,
            result.per_label[0][i].estimate,
            result.per_label[1][i].estimate if current is not None else None,
            result.per_label[base_at][i].estimate if base_at is not None else None,
            result.label_difference[0][i] if current is not None else None,
            rule,
            scored.name,
        )
        for i, key in enumerate(candidate.labels)
    )
    comparison = SetComparison(
        name=scored.name,
        records=candidate.records,
        candidate=result.micro[0],
        current=result.micro[1] if current is not None else None,
        base=result.micro[base_at] if base_at is not None else None,
        difference=result.micro_difference[0] if current is not None else None,
        labels=labels,
        passed=None,
        reasons=(),
    )
    if current is None:
        return comparison
    passed, reasons = _judge_set(comparison, rule, role)
    return replace(comparison, passed=passed, reasons=reasons)


def _judge_label(
    key: tuple[str, str],
    support: int,
    candidate_f1: float,
    current_f1: float | None,
    base_f1: float | None,
    difference: Interval | None,
    rule: PromotionRule,
    where: str,
) -> LabelComparison:
    def made(verdict: str, reason: str = "") -> LabelComparison:
        return LabelComparison(*key, support, candidate_f1, current_f1, base_f1, difference, verdict, reason)

    name = f"{where}: {key[0]}/{key[1]} (support {support})"
    if current_f1 is None or difference is None:
        return made(NOT_COMPARED)
    if support == 0:
        return made(NO_GOLD)
    if support >= rule.min_vanish_support and current_f1 > 0 and candidate_f1 == 0:
        return made(VANISHED, f"{name}: the current model's F1 is {current_f1:.4f}, the candidate finds none (F1 0)")
    if support < rule.min_support:
        return made(LOW_SUPPORT)
    if _regressed(difference, rule.max_label_drop):
        words = _drop_words(difference, rule.max_label_drop, rule.confidence)
        return made(REGRESSED, f"{name}: F1 {current_f1:.4f} -> {candidate_f1:.4f}, {words}")
    return made(OK)


def _regressed(difference: Interval, tolerance: float) -> bool:
    """A drop larger than the tolerance whose whole interval lies below 0 (rule 2)."""
    return difference.estimate < -tolerance and difference.high < 0


def _judge_set(comparison: SetComparison, rule: PromotionRule, role: str) -> tuple[bool, tuple[str, ...]]:
    difference = comparison.difference
    assert difference is not None and comparison.current is not None
    lost = [label.reason for label in comparison.labels if label.verdict in (REGRESSED, VANISHED)]
    head = f"{comparison.name} ({comparison.records} records): {_f1_words(comparison)}"
    interval = f"the difference {_signed(difference.estimate)}, {_ci_words(difference, rule.confidence)}"
    if role == "test":
        better = difference.low > rule.margin
        if better:
            verdict = f"its lower bound is above the margin {rule.margin:g}"
        else:
            why = (
                "the gain may be sampling noise" if difference.estimate > rule.margin else "the candidate is not better"
            )
            verdict = f"its lower bound {_signed(difference.low)} is not above the margin {rule.margin:g} ({why})"
        overall = f"{head}; {interval}: {verdict}"
    else:
        better = not _regressed(difference, rule.max_guard_drop)
        if better:
            overall = f"{head}; no regression beyond {rule.max_guard_drop:g} ({interval})"
        else:
            overall = f"{head}; {_drop_words(difference, rule.max_guard_drop, rule.confidence)}"
    if not lost and better and role == "guard":
        overall += "; no label lost"
    return better and not lost, (overall, *lost)


def _f1_words(comparison: SetComparison) -> str:
    out = f"candidate F1 {comparison.candidate.estimate:.4f}"
    if comparison.current is not None:
        out += f", current model {comparison.current.estimate:.4f}"
    if comparison.base is not None:
        out += f", base model {comparison.base.estimate:.4f}"
    return out


def _drop_words(difference: Interval, tolerance: float, confidence: float) -> str:
    return (
        f"difference {_signed(difference.estimate)}, {_ci_words(difference, confidence)}: a drop of more than "
        f"{tolerance:g} that the interval does not explain as noise"
    )


def _ci_words(interval: Interval, confidence: float) -> str:
    return f"{_percent(confidence)} CI [{_signed(interval.low)}, {_signed(interval.high)}]"


def _signed(value: float) -> str:
    return f"{value:+.4f}"


def _percent(confidence: float) -> str:
    value = 100 * confidence
    return f"{value:.0f}%" if math.isclose(value, round(value)) else f"{value:g}%"
