"""The validation table people read (no server): kinds without labels get no F1 column, numbers are rounded,
epochs are 1-based."""

from __future__ import annotations

from prefect_gliner2.flows.report_text import validation_rows


def _entry(per_label: list[dict[str, object]] | None) -> dict[str, object]:
    return {
        "step": 4,
        "epoch": 0,
        "batch": 7,
        "eval_precision": 0.123456789,
        "eval_recall": 0.5,
        "eval_f1": 0.2,
        "eval_entity_f1": 0.2,
        "eval_relation_f1": 0.0,
        "eval_classification_f1": 0.0,
        "eval_structure_f1": 0.0,
        "eval_macro_f1": 0.2,
        "eval_loss": 1.23456789,
        "per_label": per_label,
    }


def _label(kind: str, label: str) -> dict[str, object]:
    return {"kind": kind, "label": label, "precision": 0.5, "recall": 0.25, "f1": 1 / 3, "support": 4}


def test_only_kinds_with_labels_get_an_f1_column() -> None:
    [row] = validation_rows([_entry([_label("entities", "person"), _label("relations", "works_for")])])
    assert "eval_entity_f1" in row and "eval_relation_f1" in row
    assert "eval_classification_f1" not in row and "eval_structure_f1" not in row  # would read a misleading 0
    assert row["person P / R / F1"] == "0.500 / 0.250 / 0.333"
    assert row["relations/works_for P / R / F1"] == "0.500 / 0.250 / 0.333"
    assert (row["epoch"], row["step"], row["batch"]) == (1, 4, 7)
    assert row["eval_precision"] == 0.123457 and row["eval_loss"] == 1.23457


def test_without_per_label_scores_every_measured_key_stays() -> None:
    [row] = validation_rows([_entry(None)])
    assert {"eval_entity_f1", "eval_relation_f1", "eval_classification_f1", "eval_structure_f1"} <= set(row)


def test_each_label_shows_how_many_false_positives_are_another_labels() -> None:
    person = {**_label("entities", "person"), "fp": 5, "confused": 3, "confused_with": {"city": 2, "day": 1}}
    city = {**_label("entities", "city"), "fp": 1, "confused": 0, "confused_with": {}}
    fitted = [{**person, "confused": 1, "confused_with": {"city": 1}, "threshold": 0.3}, {**city, "threshold": 0.5}]
    [row] = validation_rows([{**_entry([person, city]), "per_label_fitted": fitted}])
    assert row["person fp that are another label's"] == "1 (city 1)"  # at the fitted thresholds: what ships
    assert row["city fp that are another label's"] == "0"
    assert row["person fitted P / R / F1"] == "0.500 / 0.250 / 0.333 at 0.3"
    [before_the_fit] = validation_rows([_entry([person, city])])  # a history from before the fit: at eval_threshold
    assert before_the_fit["person fp that are another label's"] == "3 (city 2, day 1)"
