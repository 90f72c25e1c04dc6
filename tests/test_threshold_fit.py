"""Fitting thresholds on validation data: a hand-made case whose answer is known, ties, and support."""

from __future__ import annotations

from typing import Any

from prefect_gliner2.session_core.threshold_fit import GRID, fit_thresholds, fit_with_model, with_threshold
from prefect_gliner2.session_core.thresholds import Thresholds


def _mention(text: str, confidence: float) -> dict[str, Any]:
    return {"text": text, "confidence": confidence}


def _case(persons: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`persons` records whose one gold person is found at 0.32 with a wrong mention at 0.22, and 10 records
    whose gold city is found at 0.82 with a wrong mention at 0.62 (and one record whose city is found at 0.42).

    person: a threshold in (0.22, 0.32] keeps exactly the right mentions; city: one in (0.62, 0.82]."""
    gold, predictions = [], []
    for i in range(persons):
        gold.append({"entities": {"person": [f"P{i}"]}})
        predictions.append({"entities": {"person": [_mention(f"P{i}", 0.32), _mention(f"X{i}", 0.22)], "city": []}})
    for i in range(10):
        gold.append({"entities": {"city": [f"C{i}"]}})
        found = [_mention(f"C{i}", 0.82), _mention(f"Y{i}", 0.62)]
        predictions.append({"entities": {"person": [], "city": found}})
    gold.append({"entities": {"city": ["Lowtown"]}})
    predictions.append({"entities": {"person": [], "city": [_mention("Lowtown", 0.42)]}})
    return gold, predictions


def test_hand_made_case_per_label_values_and_the_f1_they_buy() -> None:
    gold, predictions = _case()
    fitted = fit_thresholds(gold, predictions, min_support=10)
    # global: at 0.25 and 0.30 person tp 10, city tp 11 fp 10 (the 0.62s kept): F1 42/52, the best (0.65-0.80:
    # person tp 0, F1 20/31; 0.35-0.40: 22/42); the tie goes to the value nearest 0.5: 0.30
    assert fitted.threshold == 0.3
    assert fitted.details["f1_global"] == 42 / 52
    # per label from the global 0.30: city (support 11) at 0.65-0.80 drops the 10 wrong 0.62s and Lowtown (0.42):
    # tp 10, fn 1, so micro F1 40/41, the best; the tie goes to the value nearest the global 0.30: 0.65. person
    # (support 10) is already perfect at 0.30
    assert dict(fitted.entities) == {"city": 0.65, "person": 0.3}
    assert fitted.details["f1"] == 40 / 41
    # at gliner2's default 0.5: person finds nothing (tp 0 fn 10), city tp 10 fp 10 fn 1 -> 20 / (20 + 21)
    assert fitted.details["f1_default"] == 20 / 41
    assert fitted.fitted and fitted.details["records"] == 21
    assert fitted.details["support"] == {"entities/city": 11, "entities/person": 10}


def test_labels_below_min_support_use_the_global_value() -> None:
    gold, predictions = _case(persons=9)  # person support 9 < 10
    fitted = fit_thresholds(gold, predictions, min_support=10)
    assert "person" not in fitted.entities and fitted.for_label("entities", "person") == fitted.threshold
    assert fitted.entities["city"] == 0.65
    assert fit_thresholds(gold, predictions, min_support=100).entities == {}


def test_ties_go_toward_half_and_nothing_found_keeps_the_default() -> None:
    gold = [{"entities": {"person": ["Ann"]}}] * 12
    perfect = [{"entities": {"person": [_mention("Ann", 0.99)]}}] * 12  # every value in the grid gives F1 1.0
    fitted = fit_thresholds(gold, perfect)
    assert (fitted.threshold, dict(fitted.entities)) == (0.5, {"person": 0.5})
    assert fitted.details["f1"] == fitted.details["f1_default"] == 1.0
    nothing = [{"entities": {"person": []}}] * 12
    assert fit_thresholds(gold, nothing).threshold == 0.5


def test_relations_need_head_and_tail_and_structures_are_fitted_per_field() -> None:
    relation = {"head": _mention("Ann", 0.9), "tail": _mention("Acme", 0.3)}
    payload = {
        "entities": {"person": [_mention("Ann", 0.9)]},
        "relation_extraction": {"works_for": [relation]},
        "order": [{"id": _mention("7", 0.6), "items": [_mention("pen", 0.2), _mention("ink", 0.8)]}],
    }
    t = Thresholds(threshold=0.5, fields={"order.items": 0.1})
    out = with_threshold(payload, t, ["order"])
    assert out["relation_extraction"] == {"works_for": []}  # the tail is below 0.5
    assert out["order"] == [{"id": _mention("7", 0.6), "items": [_mention("pen", 0.2), _mention("ink", 0.8)]}]
    out = with_threshold(payload, Thresholds(threshold=0.7), ["order"])
    assert out["order"] == [{"id": None, "items": [_mention("ink", 0.8)]}]
    assert with_threshold(payload, Thresholds(threshold=0.25))["relation_extraction"] == {"works_for": [relation]}

    gold = [{"relations": [{"works_for": {"head": "Ann", "tail": "Acme"}}]}] * 10
    fitted = fit_thresholds(gold, [{"relation_extraction": {"works_for": [relation]}}] * 10)
    assert (fitted.threshold, dict(fitted.relations)) == (0.3, {"works_for": 0.3})
    assert fitted.details["f1_default"] == 0.0 and fitted.details["f1"] == 1.0


def test_fit_with_model_extracts_once_at_the_floor_in_the_shuffled_order() -> None:
    pairs = [("Ann met Bo", {"entities": {"person": ["Ann", "Bo"], "city": []}}) for _ in range(6)]
    calls: list[tuple[list[str], list[dict[str, Any]], float]] = []

    def extract(texts: list[str], schemas: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
        calls.append((texts, schemas, threshold))
        return [{"entities": {"person": [_mention("Ann", 0.7), _mention("Bo", 0.4)], "city": []}} for _ in texts]

    fitted = fit_with_model(pairs, extract, seed=3, min_support=10)
    assert len(calls) == 1 and calls[0][2] == GRID[0]
    orders = {tuple(schema["entities"]) for schema in calls[0][1]}
    assert orders == {("person", "city"), ("city", "person")}  # seeded shuffles per record, not one fixed order
    assert fitted.threshold == 0.4 and fitted.details["f1"] == 1.0 and fitted.details["f1_default"] == 2 * 6 / 18
