"""The promotion decision on hand-made predictions scored through the real scorer: promote only a clear, safe gain."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from prefect_gliner2.session_core.errors import ConfigError, RecordError
from prefect_gliner2.session_core.promotion import (
    PromotionDecision,
    PromotionRule,
    ScoredSet,
    decide_promotion,
)
from prefect_gliner2.session_core.promotion_report import decision_markdown, decision_text
from prefect_gliner2.session_core.record_counts import RecordCounts
from prefect_gliner2.session_core.scoring import Counts, score_records

N = 300  # test records: person in every record, city in every second one, company in every fourth


def gold_outputs(n: int = N, *, rare: int = 0) -> list[dict[str, Any]]:
    """Gold entities; the first `rare` records also carry one 'award' mention (a label with little support)."""
    out = []
    for i in range(n):
        entities: dict[str, list[str]] = {
            "person": [f"Person {i}"],
            "city": [f"City {i}"] if i % 2 == 0 else [],
            "company": [f"Company {i}"] if i % 4 == 0 else [],
        }
        if rare:
            entities["award"] = [f"Award {i}"] if i < rare else []
        out.append({"entities": entities})
    return out


def predict(gold: list[dict[str, Any]], wrong: Mapping[str, Iterable[int]]) -> list[dict[str, Any]]:
    """Gold copied as the prediction, except that label's mention in the `wrong` records, which is mistaken."""
    misses = {label: set(records) for label, records in wrong.items()}
    predictions = []
    for i, record in enumerate(gold):
        entities = {
            label: (["Somebody Else"] if mentions and i in misses.get(label, set()) else list(mentions))
            for label, mentions in record["entities"].items()
        }
        predictions.append({"entities": entities})
    return predictions


def counts(gold: list[dict[str, Any]], wrong: Mapping[str, Iterable[int]]) -> RecordCounts:
    return RecordCounts.from_report(score_records(gold, predict(gold, wrong), per_record=True))


def some(label_records: range, fraction: float, seed: int) -> list[int]:
    records = list(label_records)
    return random.Random(seed).sample(records, round(fraction * len(records)))


PERSON, CITY = range(N), range(0, N, 2)


def test_a_clearly_better_candidate_is_promoted_and_its_numbers_are_the_scorers():
    gold = gold_outputs()
    current = counts(gold, {"person": some(PERSON, 0.3, 1)})
    candidate = counts(gold, {"person": some(PERSON, 0.1, 2)})
    decision = decide_promotion(ScoredSet("test_data", candidate, current))
    assert decision.promote and decision.verdict == "promoted"
    assert decision.test.difference is not None and decision.test.difference.low > 0
    report = score_records(gold, predict(gold, {"person": some(PERSON, 0.1, 2)}))
    assert decision.test.candidate.estimate == report.metrics()["eval_f1"]  # the bootstrap's point is the scorer's F1
    person = next(label for label in decision.test.labels if label.label == "person")
    assert person.candidate_f1 == report.labels[("entities", "person")].f1 and person.support == N
    assert "lower bound is above the margin 0" in decision.reasons[0]


def test_a_candidate_better_by_noise_is_not_promoted():
    gold = gold_outputs()
    current_wrong = some(PERSON, 0.2, 3)
    fixed, broken = current_wrong[:6], [i for i in PERSON if i not in current_wrong][:4]
    candidate_wrong = [i for i in current_wrong if i not in fixed] + broken  # 10 records flipped, 2 net gains
    current, candidate = counts(gold, {"person": current_wrong}), counts(gold, {"person": candidate_wrong})
    decision = decide_promotion(ScoredSet("test_data", candidate, current))
    assert decision.test.candidate.estimate > decision.test.current.estimate  # better on these records...
    assert not decision.promote  # ...but not beyond noise
    assert decision.test.difference.low <= 0 < decision.test.difference.high
    assert "the gain may be sampling noise" in decision.reasons[0]
    identical = decide_promotion(ScoredSet("test_data", current, current))
    assert not identical.promote and identical.test.difference.to_dict() == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert "the candidate is not better" in identical.reasons[0]


def test_an_overall_gain_that_loses_a_well_supported_label_is_not_promoted():
    gold = gold_outputs()
    current = counts(gold, {"person": some(PERSON, 0.4, 4), "city": some(CITY, 0.05, 5)})
    candidate = counts(gold, {"person": some(PERSON, 0.05, 6), "city": some(CITY, 0.35, 7)})
    decision = decide_promotion(ScoredSet("test_data", candidate, current))
    assert decision.test.difference.low > 0  # better overall beyond noise...
    assert not decision.promote  # ...but city regressed
    verdicts = {label.label: label.verdict for label in decision.test.labels}
    assert verdicts == {"city": "regressed", "company": "ok", "person": "ok"}
    assert any(reason.startswith("test_data: entities/city (support 150): F1 ") for reason in decision.reasons)
    # a small drop within the tolerance does not reject
    mild = counts(gold, {"person": some(PERSON, 0.05, 6), "city": some(CITY, 0.08, 7)})
    assert decide_promotion(ScoredSet("test_data", mild, current)).promote


def test_a_vanished_label_is_caught_even_below_min_support():
    gold = gold_outputs(rare=5)
    current = counts(gold, {"person": some(PERSON, 0.3, 8), "award": [0, 1]})  # 3 of 5 awards right, 2 wrong: F1 0.6
    candidate = counts(gold, {"person": some(PERSON, 0.05, 9), "award": range(5)})  # finds none
    decision = decide_promotion(ScoredSet("test_data", candidate, current), rule=PromotionRule(min_support=10))
    award = next(label for label in decision.test.labels if label.label == "award")
    assert (award.support, award.current_f1, award.candidate_f1, award.verdict) == (5, 0.6, 0.0, "vanished")
    assert not decision.promote and decision.test.difference.low > 0
    assert "the candidate finds none (F1 0)" in award.reason and award.reason in decision.reasons
    relaxed = PromotionRule(min_support=10, min_vanish_support=6)  # too few gold items to judge: shown, not judged
    assert decide_promotion(ScoredSet("test_data", candidate, current), rule=relaxed).promote


def test_a_regression_on_the_guard_set_rejects_and_base_scores_sit_beside():
    gold, guard_gold = gold_outputs(), gold_outputs(120)
    current = counts(gold, {"person": some(PERSON, 0.3, 10)})
    candidate = counts(gold, {"person": some(PERSON, 0.1, 11)})
    base = counts(gold, {"person": some(PERSON, 0.6, 12)})
    test = ScoredSet("test_data", candidate, current, base)
    kept = counts(guard_gold, {"person": some(range(120), 0.05, 13)})
    forgot = counts(guard_gold, {"person": some(range(120), 0.5, 14), "company": range(0, 120, 4)})
    decision = decide_promotion(test, guard=ScoredSet("guard_data", forgot, kept))
    assert decision.test.passed and decision.guard is not None and decision.guard.passed is False
    assert not decision.promote and all(reason.startswith("guard_data") for reason in decision.reasons)
    assert "a drop of more than 0.05 that the interval does not explain as noise" in decision.reasons[0]
    assert {label.label: label.verdict for label in decision.guard.labels}["company"] == "vanished"
    assert decision.test.base is not None and decision.test.base.estimate < decision.test.current.estimate
    safe = decide_promotion(test, guard=ScoredSet("guard_data", kept, kept))
    assert safe.promote and safe.guard.passed and safe.reasons[-1].endswith("no label lost")


def test_the_first_candidate_is_promoted_with_its_scores_shown():
    gold = gold_outputs()
    candidate = counts(gold, {"person": some(PERSON, 0.5, 15)})
    decision = decide_promotion(ScoredSet("test_data", candidate))
    assert decision.promote and decision.test.passed is None and decision.test.difference is None
    assert decision.reasons[0].startswith("there is no current model: the first candidate is promoted")
    assert {label.verdict for label in decision.test.labels} == {"not compared"}
    assert decision.test.candidate.low < decision.test.candidate.estimate < decision.test.candidate.high


def test_the_bootstrap_is_deterministic_for_a_seed_and_close_across_seeds():
    gold = gold_outputs()
    test = ScoredSet(
        "test_data", counts(gold, {"person": some(PERSON, 0.2, 16)}), counts(gold, {"person": some(PERSON, 0.25, 17)})
    )
    first = decide_promotion(test, rule=PromotionRule(seed=7)).to_dict()
    assert decide_promotion(test, rule=PromotionRule(seed=7)).to_dict() == first
    other = decide_promotion(test, rule=PromotionRule(seed=8)).test.difference
    difference = PromotionDecision.from_dict(first).test.difference
    assert other.estimate == difference.estimate and (other.low, other.high) != (difference.low, difference.high)
    width = difference.high - difference.low
    assert abs(other.low - difference.low) < 0.1 * width and abs(other.high - difference.high) < 0.1 * width
    for method in ("basic", "BCa"):  # the other interval methods agree roughly with the percentile one
        interval = decide_promotion(test, rule=PromotionRule(method=method)).test.difference
        assert abs(interval.low - difference.low) < 0.25 * width and interval.low < interval.high


def test_the_decision_round_trips_through_json_and_renders_for_people():
    gold, guard_gold = gold_outputs(), gold_outputs(40)
    test = ScoredSet(
        "test_data",
        counts(gold, {"person": some(PERSON, 0.1, 18), "city": some(CITY, 0.4, 19)}),
        counts(gold, {"person": some(PERSON, 0.3, 20)}),
        counts(gold, {"person": some(PERSON, 0.6, 21)}),
    )
    guard = ScoredSet("guard_data", counts(guard_gold, {}), counts(guard_gold, {}))
    decision = decide_promotion(test, guard=guard, rule=PromotionRule(resamples=500, confidence=0.9))
    as_json = json.loads(json.dumps(decision.to_dict()))
    assert PromotionDecision.from_dict(as_json) == decision and as_json["verdict"] == "rejected"
    markdown, text = decision_markdown(decision), decision_text(decision)
    for rendered in (markdown, text):
        assert (
            "rejected" in rendered and "test_data (300 records)" in rendered and "guard_data (40 records)" in rendered
        )
        assert "entities/city" in rendered and "regressed" in rendered and "90% CI" in rendered
        assert "500 paired bootstrap resamples" in rendered and decision.reasons[0] in rendered
    assert "| candidate - current |" in markdown and "| entities/city | 150 |" in markdown
    with pytest.raises(ConfigError, match="format 1"):
        PromotionDecision.from_dict({"format": 99})


def test_per_record_counts_sum_to_the_report_for_every_task_kind():
    gold = [
        {
            "entities": {"person": ["Ann"]},
            "relations": [{"works_for": {"head": "Ann", "tail": "Acme"}}],
            "classifications": [{"task": "tone", "labels": ["good", "bad"], "true_label": "good"}],
            "json_structures": [{"deal": {"buyer": "Acme", "price": "5"}}],
        },
        {
            "entities": {"person": ["Bob", "Bob"]},
            "classifications": [{"task": "topic", "labels": ["a"], "true_label": "a"}],
        },
    ]
    predictions = [
        {
            "entities": {"person": ["Ann", "Zed"]},
            "relation_extraction": {"works_for": [("Ann", "Acme")]},
            "tone": "bad",
            "deal": [{"buyer": "Acme", "price": "6"}],
        },
        {"entities": {"person": ["Bob"]}, "topic": "a"},
    ]
    report = score_records(gold, predictions, per_record=True)
    assert score_records(gold, predictions).to_dict() == report.to_dict()  # per_record changes nothing else
    table = RecordCounts.from_report(report)
    assert table.label_totals() == report.labels and table.total() == report.total()
    assert table.records == 2 and report.per_record[1][("classifications", "topic")] == Counts(1, 0, 0)
    assert ("classifications", "topic") not in report.per_record[0]  # scored only where the record carries it
    assert RecordCounts.from_dict(json.loads(json.dumps(table.to_dict()))) == table
    with pytest.raises(RecordError, match="per_record=True"):
        RecordCounts.from_report(score_records(gold, predictions))


def test_models_scored_on_different_records_are_refused():
    gold = gold_outputs(20)
    candidate = counts(gold, {})
    with pytest.raises(RecordError, match="10 records against 20"):
        decide_promotion(ScoredSet("test_data", candidate, counts(gold[:10], {})))
    shifted = counts(gold[1:] + gold[:1], {})
    with pytest.raises(RecordError, match="record 0 has different gold items for entities/city"):
        decide_promotion(ScoredSet("test_data", candidate, shifted))
    with pytest.raises(RecordError, match="the labels differ"):
        decide_promotion(ScoredSet("test_data", candidate, counts(gold_outputs(20, rare=2), {})))
    with pytest.raises(RecordError, match="at least 2 records"):
        decide_promotion(ScoredSet("test_data", counts(gold[:1], {}), counts(gold[:1], {})))
    with pytest.raises(ConfigError, match="guard-set counts"):
        decide_promotion(ScoredSet("test_data", candidate, candidate), guard=ScoredSet("guard", candidate))
    with pytest.raises(RecordError, match="expected 3 non-negative integer counts"):
        RecordCounts((("entities", "person"),), ((1, -1, 0),))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"margin": 1.0}, "margin must be strictly between -1 and 1"),
        ({"confidence": 0.0}, "confidence must be strictly between 0 and 1"),
        ({"confidence": float("nan")}, "confidence must be a number"),
        ({"resamples": 10}, "resamples must be an integer between 100 and 1,000,000, got 10"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"min_support": True}, "min_support must be an integer >= 1, got True"),
        ({"max_label_drop": 1.5}, "max_label_drop must be between 0 and 1"),
        ({"method": "bca"}, "method must be one of \\['percentile', 'basic', 'BCa'\\]"),
    ],
)
def test_rule_settings_are_validated(settings: dict[str, Any], message: str):
    with pytest.raises(ConfigError, match=message):
        PromotionRule(**settings)


def test_rule_round_trips_and_refuses_unknown_settings():
    rule = PromotionRule(margin=0, confidence=0.9, resamples=500, seed=3, method="BCa", min_support=5)
    assert rule.margin == 0.0 and isinstance(rule.margin, float)
    assert PromotionRule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule
    assert PromotionRule.from_dict({"margin": 0.01}) == PromotionRule(margin=0.01)
    with pytest.raises(ConfigError, match="unknown promotion rule settings \\['treshold'\\]"):
        PromotionRule.from_dict({"treshold": 0.5})


def test_the_decision_modules_import_no_numpy_or_scipy():
    script = (
        "import sys\n"
        "import prefect_gliner2.session_core.promotion, prefect_gliner2.session_core.promotion_report\n"
        "print(sorted(m for m in ('numpy', 'scipy', 'torch', 'prefect') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_label_drop_rejects_when_beyond_the_tolerance_and_beyond_noise():
    gold = gold_outputs(rare=12)
    current_wrong = some(PERSON, 10 / N, 22)
    lost = [i for i in PERSON if i not in current_wrong][:18]
    current = counts(gold, {"person": current_wrong})
    candidate = counts(gold, {"person": current_wrong + lost, "award": [0]})  # and 1 of 12 awards missed
    labels = {label.label: label for label in decide_promotion(ScoredSet("t", candidate, current)).test.labels}
    person, award = labels["person"], labels["award"]
    # person: a drop of 0.06 whose interval lies below 0, though not wholly below -0.05: a clear drop, rejected
    assert person.difference.estimate < -0.05 < person.difference.high < 0 and person.verdict == "regressed"
    # award: a drop of 0.083 on 12 gold items whose interval reaches 0 (one record): may be noise, not rejected
    assert award.difference.estimate < -0.05 and award.difference.high == 0 and award.verdict == "ok"


def test_the_flow_form_offers_every_rule_setting_with_the_rules_defaults_and_ranges():
    from dataclasses import fields

    from pydantic import ValidationError

    from prefect_gliner2.flows.promotion_settings import DEFAULT_PROMOTION, PromotionSettings

    assert set(PromotionSettings.model_fields) == {f.name for f in fields(PromotionRule)}
    assert DEFAULT_PROMOTION.to_rule() == PromotionRule()
    assert PromotionSettings(margin=-0.5, method="BCa").to_rule() == PromotionRule(margin=-0.5, method="BCa")
    for bad in ({"margin": 1.0}, {"resamples": 10}, {"method": "bca"}, {"confidence": 0.0}, {"treshold": 0.5}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            PromotionSettings(**bad)
