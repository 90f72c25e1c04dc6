"""ManagedTraining qualification: managed == direct bitwise, exact managed continuation, selection, early stopping."""

from __future__ import annotations

import json
import math
import os

import pytest
import safetensors.torch
import torch

from prefect_gliner2.session_core.fitted_scores import fitted_metrics
from prefect_gliner2.session_core.label_order import extraction_schemas, shuffle_schema
from prefect_gliner2.session_core.metrics import EXTRACTION_KEYS, SCORE_KEYS
from prefect_gliner2.session_core.scoring import DatasetSchema, score_records
from prefect_gliner2.session_core.threshold_table import FLOOR
from prefect_gliner2.training import (
    ConfigError,
    ManagedTraining,
    PlanMismatchError,
    SessionStateError,
    TrainingSession,
)
from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES

from support.session import (
    CASE_IDS,
    CASES,
    assert_bitwise_equal,
    eval_records,
    make_config,
    make_model,
    make_plan,
    run_child,
    run_direct,
    snapshot,
)

EVAL = {"eval_strategy": "epoch"}
SUMMARY_KEYS = (
    "total_steps",
    "total_epochs",
    "total_time_seconds",
    "samples_per_second",
    "best_metric",
    "train_metrics_history",
    "eval_metrics_history",
)


def managed(arch: str, lora: bool, **overrides):
    config = make_config(arch, lora, **{**EVAL, **overrides})
    plan = make_plan(arch, config)
    session = TrainingSession(make_model(arch), config, max_steps=plan.max_steps)
    return ManagedTraining(session, plan, eval_examples=eval_records()), plan


@pytest.mark.parametrize(("arch", "lora"), CASES, ids=CASE_IDS)
def test_managed_equals_direct_bitwise_with_validation_on(arch, lora, tmp_path):
    run, plan = managed(arch, lora)
    seen = []
    before = sorted(os.listdir(tmp_path))
    result = run.run(on_step=lambda step, metrics: seen.append((step, dict(metrics))))
    assert sorted(os.listdir(tmp_path)) == before  # validation writes nothing behind the caller's back
    managed_state = snapshot(run.session)
    assert all(key in result for key in SUMMARY_KEYS)
    assert result["total_steps"] == plan.max_steps and result["total_epochs"] == 2
    assert len(result["eval_metrics_history"]) == 2 and math.isfinite(result["best_metric"])
    assert [s for s, m in seen if "loss" in m] == list(range(1, plan.max_steps + 1))
    assert any("eval_loss" in m for _, m in seen)

    config = make_config(arch, lora, **EVAL)
    direct = TrainingSession(make_model(arch), config, max_steps=plan.max_steps)
    losses = run_direct(direct, plan)
    assert_bitwise_equal(snapshot(direct), managed_state)
    windows = [sum(losses[a:b]) for a, b in _windows(plan)]
    assert [entry["loss"] for entry in result["train_metrics_history"]] == windows


def _windows(plan):
    start = 0
    for i in range(plan.batch_count):
        if plan.is_update(i):
            yield start, i + 1
            start = i + 1


POINTS = {
    "mid-window": 2,  # batches 0-1 done, two micro-batches pending
    "at-update": 3,  # batch 2 was an update, mid-epoch
    "epoch-end": "due",  # epoch 0 finished, its validation still due
    "after-validation": 5,  # epoch 0 finished and validated
}


def _checkpoint_at(run: ManagedTraining, point, uri: str) -> None:
    if point == "due":
        run.run(until=4)
        run.train_batch()
        assert run.validation_due
    else:
        run.run(until=point)
        assert not run.validation_due
    run.save_state(uri)


# every case resumes mid-window and right after a validation; span-full and boundary-lora also at an update
# and at an epoch end whose validation is still due
RESUME_CASES = [
    (arch, lora, point)
    for (arch, lora) in CASES
    for point in POINTS
    if point in ("mid-window", "after-validation") or (arch, lora) in (("span", False), ("boundary", True))
]


@pytest.mark.parametrize(
    ("arch", "lora", "point"), RESUME_CASES, ids=[f"{a}-{'lora' if lo else 'full'}-{p}" for a, lo, p in RESUME_CASES]
)
def test_exact_continuation_from_managed_checkpoints(arch, lora, point, tmp_path):
    run, plan = managed(arch, lora, save_best=True)
    _checkpoint_at(run, POINTS[point], str(tmp_path / "ckpt"))
    result = run.run()
    run.export_weights(str(tmp_path / "expected"))
    expected = snapshot(run.session)

    child = run_child(
        "session_child",
        {
            "arch": arch,
            "lora": lora,
            "mode": "managed",
            "eval": True,
            "config": {**EVAL, "save_best": True},
            "checkpoint": str(tmp_path / "ckpt"),
            "out": str(tmp_path / "out.st"),
            "export": str(tmp_path / "resumed"),
        },
        interpreter=(arch, lora, point) == RESUME_CASES[0],  # one in a fresh interpreter, the others forked
    )
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "out.st")), expected)
    for key in ("train_metrics_history", "eval_metrics_history", "best_metric", "best_step", "total_steps"):
        assert child[key] == result[key], key
    exported = "adapter/adapter_model.safetensors" if lora else "model.safetensors"
    assert_bitwise_equal(
        safetensors.torch.load_file(str(tmp_path / "resumed" / exported)),
        safetensors.torch.load_file(str(tmp_path / "expected" / exported)),
    )


def test_best_selection_keeps_a_detached_copy_and_exports_best_or_final(tmp_path):
    run, plan = managed("span", False, save_best=True, num_epochs=3, metric_for_best="eval_loss")
    run.run()
    history = [entry["eval_loss"] for entry in run.eval_metrics_history]
    best_index = min(range(len(history)), key=history.__getitem__)
    assert run.best_metric == history[best_index]
    assert run.best_step == run.eval_metrics_history[best_index]["step"]
    assert all(t.device.type == "cpu" for t in run.best_state.values())
    live = run.session.model.state_dict()
    if run.best_step != run.session.step:
        assert not all(torch.equal(run.best_state[k], live[k]) for k in live)
    before = snapshot(run.session)
    run.export_weights(str(tmp_path / "best"), which="best")
    run.export_weights(str(tmp_path / "final"), which="final")
    assert_bitwise_equal(snapshot(run.session), before)
    best = safetensors.torch.load_file(str(tmp_path / "best" / "model.safetensors"))
    final = safetensors.torch.load_file(str(tmp_path / "final" / "model.safetensors"))
    assert all(torch.equal(best[k], run.best_state[k]) for k in best)
    assert all(torch.equal(final[k], live[k]) for k in final)


def test_validation_every_n_steps_uses_the_plan_boundaries():
    run, plan = managed("boundary", False, eval_strategy="steps", eval_steps=2)
    run.run()
    assert [m["step"] for m in run.eval_metrics_history] == [s for s in range(1, plan.max_steps + 1) if s % 2 == 0]


def _never_improving(**overrides):
    # any threshold above the metric's scale means no validation after the first counts as an improvement
    return managed("span", False, early_stopping=True, early_stopping_threshold=1e9, num_epochs=5, **overrides)


def test_early_stopping_stops_after_patience_validations():
    run, plan = _never_improving(early_stopping_patience=2)
    result = run.run()
    assert result["stopped_early"] and run.patience_counter == 2
    assert len(result["eval_metrics_history"]) == 3  # the first validation improves on nothing-yet
    assert result["total_epochs"] == 3 and result["total_steps"] < plan.max_steps
    with pytest.raises(SessionStateError, match="finished"):
        run.train_batch()


def test_early_stopping_counters_survive_a_resume_between_non_improving_validations(tmp_path):
    run, _ = _never_improving(early_stopping_patience=2)
    run.run(until=10)  # two validations: the first sets the best, the second does not improve
    assert run.patience_counter == 1 and not run.stopped_early
    run.save_state(str(tmp_path / "ckpt"))
    result = run.run()
    expected = snapshot(run.session)
    child = run_child(
        "session_child",
        {
            "arch": "span",
            "lora": False,
            "mode": "managed",
            "eval": True,
            "config": {
                **EVAL,
                "early_stopping": True,
                "early_stopping_threshold": 1e9,
                "num_epochs": 5,
                "early_stopping_patience": 2,
            },
            "checkpoint": str(tmp_path / "ckpt"),
            "out": str(tmp_path / "out.st"),
        },
    )
    assert child["stopped_early"] and child["total_steps"] == result["total_steps"]
    assert child["eval_metrics_history"] == result["eval_metrics_history"]
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "out.st")), expected)


def test_a_changed_plan_is_rejected_with_a_way_forward(tmp_path):
    run, plan = managed("span", False)
    run.run(until=3)
    run.save_state(str(tmp_path / "ckpt"))
    config = make_config("span", False, **EVAL, seed=12)
    other_plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=other_plan.max_steps)
    other = ManagedTraining(session, other_plan, eval_examples=eval_records())
    with pytest.raises(PlanMismatchError, match="original manifest"):
        other.load_state(str(tmp_path / "ckpt"))
    with pytest.raises(PlanMismatchError, match="validation examples"):
        same, _ = managed("span", False)
        ManagedTraining(same.session, same.plan, eval_examples=eval_records(3)).load_state(str(tmp_path / "ckpt"))
    used, _ = managed("span", False)
    used.run(until=1)
    with pytest.raises(SessionStateError, match="fresh session"):
        used.load_state(str(tmp_path / "ckpt"))
    with pytest.raises(PlanMismatchError, match="max_steps"):
        ManagedTraining(TrainingSession(make_model("span"), config, max_steps=plan.max_steps + 1), plan)


def test_selection_settings_are_checked_up_front():
    config = make_config("span", False, **EVAL, metric_for_best="eval_accuracy")
    plan = make_plan("span", config)
    with pytest.raises(ConfigError, match="eval_accuracy"):
        ManagedTraining(
            TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
        )
    config = make_config("span", False, **EVAL, early_stopping=True)
    with pytest.raises(ConfigError, match="eval_examples"):
        ManagedTraining(TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan)


# ---- extraction metrics in validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["span", "boundary"])
def test_extraction_validation_does_not_change_training(arch):
    """Validating with extraction metrics ends bitwise equal to validating with losses only."""
    extracting, plan = managed(arch, False, metric_for_best="eval_loss")
    with_extraction = extracting.run()
    losses_only, _ = managed(arch, False, eval_extraction=False)  # built after: sessions seed the global RNGs
    without = losses_only.run()
    assert_bitwise_equal(snapshot(extracting.session), snapshot(losses_only.session))
    assert with_extraction["train_metrics_history"] == without["train_metrics_history"]
    assert len(with_extraction["eval_metrics_history"]) == len(without["eval_metrics_history"]) == 2
    for full, loss in zip(with_extraction["eval_metrics_history"], without["eval_metrics_history"], strict=True):
        assert set(EXTRACTION_KEYS) <= set(full) and not set(EXTRACTION_KEYS) & set(loss)
        assert {k: full[k] for k in loss} == loss  # same losses, bit for bit
        assert all(0.0 <= full[key] <= 1.0 for key in EXTRACTION_KEYS)
        assert [row["label"] for row in full["per_label"]] == sorted(TINY_ENTITY_TYPES)
        assert sum(row["support"] for row in full["per_label"]) == _gold_mentions()
    assert extracting.session.model.training and losses_only.session.model.training
    assert with_extraction["best_metric"] == without["best_metric"]


def _gold_mentions() -> int:
    return sum(len(mentions) for record in eval_records() for mentions in record["output"]["entities"].values())


def test_validation_scores_what_gliner2_extracts_and_restores_train_mode():
    run, plan = managed("span", False, eval_threshold=0.0)
    run.run(until=plan.batches_per_epoch - 1)
    run.train_batch()  # the epoch's last batch: its validation is now due
    session = run.session
    assert session.model.training and run.validation_due
    metrics = run.validate()
    assert session.model.training and session.engine.processor.is_training
    # the same numbers from gliner2's public API on the live model, at the configured threshold
    records = eval_records()
    labels = list(DatasetSchema.of([r["output"] for r in records]).entities)  # the data's labels, first-seen order
    texts, golds = [r["input"] for r in records], [r["output"] for r in records]
    canonical = session.model.batch_extract_entities(texts, labels, batch_size=8, threshold=0.0)
    # each record asked its labels in its own seeded order (label_order.py: the config's seed, the record's position)
    orders = [shuffle_schema({"entities": labels}, seed=run.config.seed, position=i)["entities"] for i in range(4)]
    assert len({tuple(order) for order in orders}) > 1  # the orders really differ between records
    shuffled = [
        session.model.batch_extract_entities([text], order, batch_size=8, threshold=0.0)[0]
        for text, order in zip(texts, orders, strict=True)
    ]
    session.model.train()
    session.engine.processor.change_mode(is_training=True)
    expected = score_records(golds, shuffled)
    assert expected.total().predicted > 0  # threshold 0 extracts: the comparison is not vacuous
    assert {k: metrics[k] for k in SCORE_KEYS} == expected.metrics()
    assert metrics["per_label"] == expected.rows()
    assert metrics["eval_f1_canonical"] == score_records(golds, canonical).metrics()["eval_f1"]
    assert metrics["eval_f1_order_min"] <= metrics["eval_f1"] <= metrics["eval_f1_order_max"]
    # the fitted scores: one more extraction at the fit's floor with confidences, in the shuffled order of trial 0,
    # fitted and scored torch-free; selection follows the fitted micro F1 by default
    floor = session.extract(
        texts, extraction_schemas(golds, seed=run.config.seed), threshold=FLOOR, include_confidence=True
    )
    session.model.train()
    session.engine.processor.change_mode(is_training=True)
    assert {k: metrics[k] for k in fitted_metrics(golds, floor)} == fitted_metrics(golds, floor)
    assert run.config.metric_for_best == "eval_f1_fitted" and run.config.greater_is_better is True
    assert run.best_metric == metrics["eval_f1_fitted"]


def test_best_and_early_stopping_follow_eval_f1_higher_is_better():
    run, plan = managed(
        "span",
        False,
        num_epochs=3,
        eval_threshold=0.0,
        early_stopping=True,
        early_stopping_patience=5,
        metric_for_best="eval_f1",
    )
    result = run.run()
    f1s = [entry["eval_f1"] for entry in result["eval_metrics_history"]]
    best = max(range(len(f1s)), key=lambda i: (f1s[i], -i))  # the first of the highest (strictly better wins)
    assert result["best_metric"] == f1s[best] and result["best_step"] == result["eval_metrics_history"][best]["step"]


# ---- selection by the F1 of the shipped model ---------------------------------------------------------------------

# a validation history where the F1 at 0.5 and the F1 at the fitted thresholds disagree: at 0.5 the first validation
# is best (0.19, then 0.0 and 0.18), at the fitted thresholds the second (0.50, 0.70, 0.60)
HISTORY = [
    {"eval_f1": 0.19, "eval_f1_fitted": 0.50},
    {"eval_f1": 0.00, "eval_f1_fitted": 0.70},
    {"eval_f1": 0.18, "eval_f1_fitted": 0.60},
]


@pytest.mark.parametrize(("metric", "best", "stopped_after"), [(None, 2, 3), ("eval_f1", 1, 2)])
def test_selection_and_early_stopping_follow_the_fitted_f1_by_default(metric, best, stopped_after):
    """Hand-checkable: patience 1 stops at the first validation that does not beat the best so far."""
    chosen = {"metric_for_best": metric} if metric else {}
    run, _ = managed("span", False, early_stopping=True, early_stopping_patience=1, **chosen)
    assert run.config.metric_for_best == (metric or "eval_f1_fitted")
    seen = 0
    for metrics in HISTORY:
        if run.stopped_early:
            break
        run._select(metrics)
        seen += 1
    assert (seen, run.stopped_early) == (stopped_after, True)
    assert run.best_metric == HISTORY[best - 1][metric or "eval_f1_fitted"]  # the values are distinct: it names one


def test_a_run_selected_by_the_fitted_f1_resumes_bitwise(tmp_path):
    """A real tiny run: at 0.5 the model finds nothing at any validation (eval_f1 0, 0, 0: the first would stay
    best), at the fitted thresholds the second validation (step 4) is best. Checkpointed right after the first
    validation, a fresh process resumes to the same histories (fitted thresholds included), the same best step,
    bitwise equal weights and the same export (weights and export.json)."""
    config = {**EVAL, "save_best": True, "num_epochs": 3}
    run, plan = managed("span", False, **config)
    run.run(until=plan.batches_per_epoch)
    assert len(run.eval_metrics_history) == 1 and not run.validation_due
    run.save_state(str(tmp_path / "ckpt"))
    result = run.run()
    run.export_weights(str(tmp_path / "expected"))
    history = result["eval_metrics_history"]
    assert [entry["eval_f1"] for entry in history] == [0.0, 0.0, 0.0]
    fitted = [entry["eval_f1_fitted"] for entry in history]
    assert fitted[1] > max(fitted[0], fitted[2]) > 0.0 and result["best_step"] == history[1]["step"] == 4
    recorded = json.loads((tmp_path / "expected" / "export.json").read_text())["thresholds"]
    # the export's thresholds are the best validation's fit: the same extraction, fitted the same way
    assert recorded["details"]["f1"] == history[1]["eval_f1_fitted"] == result["best_metric"]
    assert recorded["details"]["macro_f1"] == history[1]["eval_macro_f1_fitted"]
    assert {k: recorded[k] for k in ("threshold", "entities", "relations", "fields")} == {
        k: history[1]["thresholds_fitted"][k] for k in ("threshold", "entities", "relations", "fields")
    }
    child = run_child(
        "session_child",
        {
            "arch": "span",
            "lora": False,
            "mode": "managed",
            "eval": True,
            "config": config,
            "checkpoint": str(tmp_path / "ckpt"),
            "out": str(tmp_path / "out.st"),
            "export": str(tmp_path / "resumed"),
        },
    )
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "out.st")), snapshot(run.session))
    for key in ("train_metrics_history", "eval_metrics_history", "best_metric", "best_step", "total_steps"):
        assert child[key] == result[key], key
    assert_bitwise_equal(
        safetensors.torch.load_file(str(tmp_path / "resumed" / "model.safetensors")),
        safetensors.torch.load_file(str(tmp_path / "expected" / "model.safetensors")),
    )
    resumed = json.loads((tmp_path / "resumed" / "export.json").read_text())["thresholds"]
    assert resumed == recorded
