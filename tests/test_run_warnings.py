"""Warnings that name a label with gold mentions at F1 0: in the run summary (validation, at the exported
thresholds), on held-out records (the demo, ``evaluate``) and in a validation's log line."""

from __future__ import annotations

from typing import Any

from prefect_gliner2.session_core.run_warnings import LABEL_ZERO_F1, ZERO_F1, label_warning, run_warnings
from prefect_gliner2.session_core.score_text import label_table, validation_scores
from prefect_gliner2.session_core.scoring import score_records
from prefect_gliner2.session_core.threshold_fit import fit_thresholds


def _fitted() -> dict[str, Any]:
    """city found at 0.9; day found at 0.3 among wrong days (its own value 0.3); lost: 2 gold items never found."""
    gold, predictions = [], []
    for i in range(20):
        gold.append({"entities": {"city": [f"C{i}"], "day": [f"D{i}"], "lost": [f"L{i}"] if i < 2 else []}})
        days = [{"text": f"D{i}", "confidence": 0.3}] + [{"text": f"W{i}{k}", "confidence": 0.31} for k in "abc"]
        predictions.append({"entities": {"city": [{"text": f"C{i}", "confidence": 0.9}], "day": days, "lost": []}})
    return fit_thresholds(gold, predictions).to_dict()


def test_the_summary_names_labels_at_f1_0_at_the_exported_thresholds() -> None:
    thresholds = _fitted()
    history = [{"step": 2, "eval_f1": 0.0, "eval_f1_fitted": 0.6}]
    warnings = run_warnings(history, architecture="span", threshold=0.5, thresholds=thresholds)
    assert set(warnings) == {LABEL_ZERO_F1}  # the model extracts at the fitted thresholds: no whole-run warning
    assert warnings[LABEL_ZERO_F1].startswith(
        "label(s) with gold mentions score F1 0 on the validation records at the exported thresholds: "
        "entities/lost (2 gold, at 0.5); entities/lost at every threshold from 0.05 to 0.95."
    )
    assert "entities/day" not in warnings[LABEL_ZERO_F1]  # kept at its own 0.3 (F1 0.4), not silenced
    assert run_warnings(history, architecture="span", threshold=0.5) == {}  # no thresholds recorded: nothing to say
    silent = [{"step": 2, "eval_f1": 0.0, "eval_f1_fitted": 0.0}]
    assert set(run_warnings(silent, architecture="span", threshold=0.5, thresholds=thresholds)) == {ZERO_F1}


def test_held_out_and_validation_lines_name_labels_at_f1_0() -> None:
    gold = [{"entities": {"city": ["Rome"], "day": ["Monday"], "person": []}}]
    predicted = [{"entities": {"city": ["Rome"], "day": [], "person": ["Rome"]}}]
    report = score_records(gold, predicted)
    rows = report.rows()
    assert label_warning(rows, "the held-out records") == (
        "F1 0 on the held-out records for label(s) with gold mentions: entities/day (1 gold)"
    )  # person has F1 0 too, but no gold mention: not a silenced label
    table = label_table(rows, report.to_dict()["total"])
    assert table[3].split() == ["entities/person", "0.0000", "0.0000", "0.0000", "0", "1", "(city", "1)"]
    metrics = {**report.metrics(), "per_label": rows}
    assert validation_scores(metrics) == (
        "F1 0.5000 (macro 0.3333; P 0.5000, R 0.5000) at eval_threshold; false positives that are another label's "
        "gold mentions: entities/person 1 of 1 (city 1); WARNING: F1 0 on this validation for label(s) with gold "
        "mentions: entities/day (1 gold)"
    )
