"""ManagedTrainingPlan: exact batches, updates, epoch ends, validations, length grouping and fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from prefect_gliner2.session_core.canonical import canonical_json
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError, ManifestError, RecordError
from prefect_gliner2.session_core.plan import (
    PLAN_ALGORITHM_VERSION,
    ManagedTrainingPlan,
    PlanBatch,
    SelectionPolicy,
    random_keys,
)
from prefect_gliner2.session_core.records import load_records

from support.config import training_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(n: int) -> list[dict[str, Any]]:
    """Small native records; input lengths repeat with period 4 (0..3 trailing words)."""
    return [
        {
            "input": f"Person {i} named John met Mary in Paris." + " again" * (i % 4),
            "output": {"entities": {"person": ["John", "Mary"]}},
        }
        for i in range(n)
    ]


def _cfg(**changes: Any) -> TrainingConfig:
    return TrainingConfig(**{"fp16": False, "bf16": False, **changes})


def _plan(n: int = 7, architecture: str = "span", **changes: Any) -> ManagedTrainingPlan:
    return ManagedTrainingPlan(_records(n), _cfg(**changes), architecture=architecture)


def _all_rows(plan: ManagedTrainingPlan) -> list[tuple[int, ...]]:
    return [plan.rows(i) for i in range(plan.batch_count)]


def test_seven_records_batch_two_accumulation_three_two_epochs_by_hand() -> None:
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2)
    # 4 batches per epoch (2, 2, 2, 1 rows); windows of 3 micro-batches: [0, 1, 2] then the flushed [3].
    assert (plan.batch_count, plan.batches_per_epoch, plan.updates_per_epoch, plan.max_steps, plan.num_epochs) == (
        8,
        4,
        2,
        4,
        2,
    )
    assert [len(r) for r in _all_rows(plan)] == [2, 2, 2, 1, 2, 2, 2, 1]
    assert [plan.is_update(i) for i in range(8)] == [False, False, True, True, False, False, True, True]
    assert [plan.is_epoch_end(i) for i in range(8)] == [False, False, False, True, False, False, False, True]
    assert [plan.epoch(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [plan.window_size(i) for i in range(8)] == [3, 3, 3, 1, 3, 3, 3, 1]
    assert [plan.step_after(i) for i in range(8)] == [0, 0, 1, 2, 2, 2, 3, 4]
    assert [plan.is_validation(i) for i in range(8)] == [False, False, False, True, False, False, False, True]
    assert plan.updates() == [2, 3, 6, 7] and plan.epoch_ends() == [3, 7] and plan.validations() == [3, 7]


def test_golden_rows_and_fingerprint_pin_the_algorithm() -> None:
    """If this fails, the plan algorithm changed: bump PLAN_ALGORITHM_VERSION and update the golden values."""
    # v2: negative labels in the batches (augment.py); v3: label subsets in the first epochs; the rows did not move
    assert PLAN_ALGORITHM_VERSION == 3
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2)
    assert _all_rows(plan) == [(2, 6), (5, 1), (4, 3), (0,), (4, 1), (2, 6), (0, 5), (3,)]
    # the fingerprint also covers the config's fields: it moved when eval_extraction / eval_threshold and the eval_f1
    # selection default arrived, again with the augmentation settings and label_order_trials, and with
    # repair_count_head (it changes the weights a run starts from), with plan algorithm v3 and its fields
    # (label_subset_prob, label_subset_until) and the recipe, with the eval_f1_fitted selection default, and with
    # label_subset_prob 0.5 (was 1.0); the rows
    # did not move
    assert plan.fingerprint == "a0ff3b73fdc65e255bf95b3b5bab24c7f5edaf5d9767de53c3e12093d0f09be8"
    grouped = _plan(7, "boundary", batch_size=2, gradient_accumulation_steps=3, num_epochs=2)
    assert _all_rows(grouped) == [(5, 1), (2, 6), (4, 0), (3,), (2, 6), (1, 5), (4, 0), (3,)]


def test_random_keys_follow_the_documented_algorithm() -> None:
    label = b"prefect-gliner2/plan/v1/rows/seed=42/epoch=0"
    raw = hashlib.shake_256(label).digest(24)
    expected = [int.from_bytes(raw[8 * j : 8 * j + 8], "little") for j in range(3)]
    assert random_keys(42, 0, "rows", 3).tolist() == expected
    assert random_keys(42, 0, "rows", 2).tolist() == expected[:2]  # prefix-stable
    keys = random_keys(42, 0, "rows", 7)
    by_key = sorted(range(7), key=lambda r: (keys[r] >> 11, r))
    assert list(_plan(7, batch_size=7).epoch_order(0)) == by_key


@pytest.mark.parametrize(
    "changes",
    [
        {"batch_size": 1},
        {"batch_size": 3, "gradient_accumulation_steps": 2},
        {"batch_size": 50},
        {"batch_size": 4, "gradient_accumulation_steps": 10, "num_epochs": 3},
        {"batch_size": 3, "length_group_window_batches": 2, "num_epochs": 3},
    ],
)
@pytest.mark.parametrize("architecture", ["span", "boundary"])
def test_every_row_exactly_once_per_epoch(changes: dict, architecture: str) -> None:
    plan = _plan(23, architecture, **changes)
    per_epoch: dict[int, Counter] = {}
    for i in range(plan.batch_count):
        per_epoch.setdefault(plan.epoch(i), Counter()).update(plan.rows(i))
    assert len(per_epoch) == plan.num_epochs
    for counts in per_epoch.values():
        assert counts == Counter(range(23))


def test_final_partial_batch_is_kept_and_flushed_at_each_epoch_end() -> None:
    plan = _plan(5, batch_size=2, gradient_accumulation_steps=4, num_epochs=3)
    assert plan.batches_per_epoch == 3 and plan.updates_per_epoch == 1 and plan.max_steps == 3
    assert plan.updates() == [2, 5, 8] == plan.epoch_ends()
    assert [plan.window_size(i) for i in range(9)] == [3] * 9
    assert [len(plan.rows(i)) for i in range(9)] == [2, 2, 1] * 3


def test_fewer_records_than_batch_size() -> None:
    plan = _plan(3, batch_size=8, num_epochs=2)
    assert plan.batch_count == 2 and plan.max_steps == 2 and sorted(plan.rows(0)) == [0, 1, 2]


def test_max_steps_caps_the_plan_mid_epoch() -> None:
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=5, max_steps=3)
    assert (plan.max_steps, plan.num_epochs, plan.batch_count) == (3, 2, 7)
    assert plan.updates() == [2, 3, 6] and plan.step_after(6) == 3
    assert plan.epoch_ends() == [3, 6] and plan.validations() == [3, 6]
    assert _all_rows(plan) == _all_rows(_plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2))[:7]


def test_max_steps_decides_epochs_like_the_native_trainer() -> None:
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=1, max_steps=5)
    assert (plan.max_steps, plan.num_epochs, plan.batch_count) == (5, 3, 11)
    assert plan.updates() == [2, 3, 6, 7, 10] and plan.step_after(10) == 5
    assert plan.is_epoch_end(10) and plan.epoch(10) == 2


def test_max_steps_on_an_epoch_boundary() -> None:
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, max_steps=4)
    assert (plan.batch_count, plan.num_epochs) == (8, 2)


def test_validation_boundaries_for_steps_and_no() -> None:
    every_two = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2, eval_strategy="steps", eval_steps=2)
    assert every_two.validations() == [3, 7]  # steps 2 and 4; step 2 comes from an epoch-end flush
    every_three = _plan(
        7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2, eval_strategy="steps", eval_steps=3
    )
    assert every_three.validations() == [6]  # no extra validation at the plan's end, as natively
    every_one = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2, eval_strategy="steps", eval_steps=1)
    assert every_one.validations() == every_one.updates()
    assert _plan(7, batch_size=2, num_epochs=2, eval_strategy="no").validations() == []
    assert [every_two.is_validation(i) for i in range(8)] == [i in (3, 7) for i in range(8)]


def test_batch_contents_and_errors() -> None:
    plan = _plan(7, batch_size=2, gradient_accumulation_steps=3, num_epochs=2)
    records = load_records(_records(7))
    batch = plan.batch(3)
    assert isinstance(batch, PlanBatch)
    assert (batch.index, batch.epoch, batch.is_update, batch.is_epoch_end, batch.is_validation, batch.window_size) == (
        3,
        0,
        True,
        True,
        True,
        1,
    )
    assert batch.rows == plan.rows(3)
    assert batch.examples == tuple(records.example(r) for r in batch.rows)
    for bad in (-1, 8, 100):
        with pytest.raises(IndexError, match=r"batch index .* is outside this plan: valid indices are 0\.\.7"):
            plan.batch(bad)
    with pytest.raises(IndexError):
        plan.is_update(8)
    with pytest.raises(IndexError):
        plan.is_validation(-1)
    with pytest.raises(TypeError):
        plan.batch(True)  # type: ignore[arg-type]


def test_plan_batch_dict_round_trip() -> None:
    batch = _plan(7, batch_size=2).batch(1)
    data = json.loads(json.dumps(batch.to_dict()))
    assert PlanBatch.from_dict(data) == batch
    with pytest.raises(ManifestError, match="needs exactly the keys"):
        PlanBatch.from_dict({**data, "extra": 1})
    with pytest.raises(ManifestError, match="non-negative integers"):
        PlanBatch.from_dict({**data, "rows": ["a", 1]})
    with pytest.raises(ManifestError, match="2 rows but 1 examples"):
        PlanBatch.from_dict({**data, "examples": data["examples"][:1]})


def test_orders_are_deterministic_and_change_with_seed_and_epoch() -> None:
    a, b = _plan(50, batch_size=5, num_epochs=3), _plan(50, batch_size=5, num_epochs=3)
    assert _all_rows(a) == _all_rows(b)
    assert _all_rows(_plan(50, batch_size=5, num_epochs=3, seed=7)) != _all_rows(a)
    assert list(a.epoch_order(0)) != list(a.epoch_order(1))
    with pytest.raises(IndexError, match="epoch 3 is outside this plan"):
        a.epoch_order(3)


def test_length_grouping_sorts_within_windows_and_keeps_partial_last() -> None:
    records = [{"input": "w " * (i + 1) + "John", "output": {"entities": {"p": ["John"]}}} for i in range(40)]
    cfg = _cfg(batch_size=4, length_group_window_batches=5, num_epochs=2)  # windows of 20 rows
    plan = ManagedTrainingPlan(records + records[:3], cfg, architecture="boundary")
    assert plan.length_grouped
    lengths = plan.records.lengths
    for epoch in range(2):
        order = list(plan.epoch_order(epoch))
        assert sorted(order) == list(range(43))
        batches = [order[k : k + 4] for k in range(0, 43, 4)]
        assert len(batches[-1]) == 3  # the only partial batch stays last
        for window_start in (0, 20):
            window_rows = set(_shuffled_window(plan, epoch, window_start, 20))
            in_window = [b for b in batches[:-1] if set(b) <= window_rows]
            spans = sorted((min(lengths[r] for r in b), max(lengths[r] for r in b)) for b in in_window)
            assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:], strict=False)), spans
    again = ManagedTrainingPlan(records + records[:3], cfg, architecture="boundary")
    assert _all_rows(again) == _all_rows(plan)
    ungrouped = ManagedTrainingPlan(records + records[:3], cfg.replace(group_by_length=False), architecture="boundary")
    assert _all_rows(ungrouped) != _all_rows(plan)


def _shuffled_window(plan: ManagedTrainingPlan, epoch: int, start: int, size: int) -> list[int]:
    """Rows of one length-grouping window: a slice of the plain shuffled order."""
    keys = random_keys(plan.config.seed, epoch, "rows", len(plan.records))
    shuffled = sorted(range(len(plan.records)), key=lambda r: (keys[r] >> 11, r))
    return shuffled[start : start + size]


def test_span_plans_are_not_length_grouped_like_native() -> None:
    grouped_cfg = _plan(30, "span", batch_size=3, group_by_length=True)
    plain = _plan(30, "span", batch_size=3, group_by_length=False)
    assert not grouped_cfg.length_grouped and _all_rows(grouped_cfg) == _all_rows(plain)
    assert grouped_cfg.fingerprint != plain.fingerprint  # the config still differs


def test_fingerprint_covers_records_config_and_architecture() -> None:
    base = _plan(10, batch_size=2)
    payload = {
        "architecture": "span",
        "config": base.config.fingerprint_fields(),
        "plan_algorithm_version": 3,
        "record_count": 10,
        "records_sha256": hashlib.sha256(b"".join(base.records.digest(i) for i in range(10))).hexdigest(),
    }
    assert base.fingerprint == hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    records = _records(10)
    changed = [dict(r) for r in records]
    changed[3] = {"input": records[3]["input"] + " Bye.", "output": records[3]["output"]}
    assert ManagedTrainingPlan(changed, base.config).fingerprint != base.fingerprint
    assert ManagedTrainingPlan(records[::-1], base.config).fingerprint != base.fingerprint
    assert _plan(10, "boundary", batch_size=2).fingerprint != base.fingerprint
    assert _plan(10, batch_size=2, seed=1).fingerprint != base.fingerprint
    assert _plan(10, batch_size=3).fingerprint != base.fingerprint
    assert (
        _plan(10, batch_size=2, output_dir="/x", logging_steps=9, experiment_name="e").fingerprint == base.fingerprint
    )


_SUBPROCESS = """
import json, sys
sys.path.insert(0, {root!r})
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
records = [
    {{"input": "Person %d met John" % i + " x" * (i % 5), "output": {{"entities": {{"p": ["John"], "q": []}}}}}}
    for i in range(40)
]
plan = ManagedTrainingPlan(records, TrainingConfig(fp16=False, bf16=False, batch_size=3, num_epochs=2,
                           length_group_window_batches=2), architecture="boundary")
print(json.dumps({{"fingerprint": plan.fingerprint, "rows": [plan.rows(i) for i in range(plan.batch_count)]}}))
"""


def test_same_plan_across_processes_with_different_hash_seeds() -> None:
    outputs = []
    for seed in ("0", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS.format(root=ROOT)], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1] == outputs[2]


def test_inputs_in_every_accepted_form(tmp_path: os.PathLike) -> None:
    class Example:
        def __init__(self, record: dict[str, Any]) -> None:
            self.record = record

        def to_dict(self) -> dict[str, Any]:
            return self.record

    path = os.path.join(tmp_path, "train.jsonl")
    with open(path, "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in _records(9))
    cfg = _cfg(batch_size=2)
    expected = ManagedTrainingPlan(_records(9), cfg).fingerprint
    assert ManagedTrainingPlan(path, cfg).fingerprint == expected
    assert ManagedTrainingPlan([Example(r) for r in _records(9)], cfg).fingerprint == expected
    assert ManagedTrainingPlan(load_records(_records(9)), cfg).fingerprint == expected
    assert ManagedTrainingPlan(_records(9), cfg.to_dict()).fingerprint == expected


def test_constructor_errors() -> None:
    with pytest.raises(ConfigError, match=r"architecture must be one of \['span', 'boundary'\], got 'bert'"):
        _plan(architecture="bert")
    with pytest.raises(ConfigError, match="config must be a TrainingConfig"):
        ManagedTrainingPlan(_records(3), object())  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="no training records"):
        ManagedTrainingPlan([], _cfg())
    with pytest.raises(RecordError, match="row 1: entity 'Zed'"):
        ManagedTrainingPlan(_records(1) + [{"input": "Hello", "output": {"entities": {"p": ["Zed"]}}}], _cfg())


def test_selection_policy_and_repr() -> None:
    plan = _plan(
        7,
        eval_strategy="steps",
        eval_steps=5,
        early_stopping=True,
        early_stopping_patience=2,
        early_stopping_threshold=0.01,
        metric_for_best="f1",
        greater_is_better=True,
        save_best=False,
    )
    assert plan.selection == SelectionPolicy(
        metric_for_best="f1",
        greater_is_better=True,
        save_best=False,
        early_stopping=True,
        early_stopping_patience=2,
        early_stopping_threshold=0.01,
        eval_strategy="steps",
        eval_steps=5,
    )
    assert plan.selection.to_dict()["early_stopping_patience"] == 2
    assert plan.fingerprint[:12] in repr(plan) and len(plan) == plan.batch_count


def test_negative_labels_are_drawn_per_seed_epoch_and_row() -> None:
    """A batch holds the same records with the same negative labels whenever it is asked for (resume, another
    process); a record gets labels of the data set it does not list, as empty answers, and keeps its own."""
    records = [
        {"input": "Ada met Bob", "output": {"entities": {"person": ["Ada", "Bob"]}}},
        {"input": "Paris is big", "output": {"entities": {"city": ["Paris"]}}},
        {"input": "Acme hired", "output": {"entities": {"company": ["Acme"]}}},
        {"input": "a topic", "output": {"classifications": [{"task": "t", "labels": ["a", "b"], "true_label": ["a"]}]}},
    ] * 4
    config = TrainingConfig(
        **training_config(negative_label_prob=0.5, label_subset_prob=0.0, num_epochs=3, gradient_accumulation_steps=1)
    )
    plan = ManagedTrainingPlan(records, config, architecture="span")
    again = ManagedTrainingPlan(records, config, architecture="span")
    batches = [plan.batch(i) for i in range(plan.batch_count)]
    assert batches == [again.batch(i) for i in range(again.batch_count)]
    added = 0
    for batch in batches:
        for row, example in zip(batch.rows, batch.examples, strict=True):
            own = records[row]["output"].get("entities")
            entities = example["output"].get("entities")
            if own is None:  # not an entity record: nothing asked of it
                assert "entities" not in example["output"]
                continue
            assert {k: v for k, v in entities.items() if k in own} == own
            extra = set(entities) - set(own)
            assert extra <= {"person", "city", "company"} and all(entities[label] == [] for label in extra)
            added += len(extra)
    assert 0 < added < sum(len(b.rows) for b in batches) * 2  # some, not all (p = 0.5)
    none = TrainingConfig(
        **training_config(negative_label_prob=0.0, label_subset_prob=0.0, num_epochs=3, gradient_accumulation_steps=1)
    )
    plain = ManagedTrainingPlan(records, none, architecture="span")
    assert all(
        [records[r] for r in b.rows] == [dict(e) for e in b.examples]
        for b in (plain.batch(i) for i in range(plain.batch_count))
    )


def test_label_subsets_ask_a_proper_subset_early_and_every_label_later() -> None:
    """With label_subset_prob 1 and label_subset_until 0.5, each multi-label record of the first half of the epochs
    asks a non-empty proper subset of its labels (with their own mentions), the same on every call; later epochs ask
    every label; a one-label record is never cut."""
    records = [
        {"input": "Acme opened a branch in Paris", "output": {"entities": {"company": ["Acme"], "city": ["Paris"]}}},
        {"input": "Ada met Bob in Rome", "output": {"entities": {"person": ["Ada", "Bob"], "city": ["Rome"], "x": []}}},
        {"input": "Ada", "output": {"entities": {"person": ["Ada"]}}},
    ] * 3
    settings = dict(negative_label_prob=0.0, num_epochs=4, gradient_accumulation_steps=1)
    config = TrainingConfig(**training_config(**settings, label_subset_prob=1.0, label_subset_until=0.5))
    plan = ManagedTrainingPlan(records, config, architecture="span")
    batches = [plan.batch(i) for i in range(plan.batch_count)]
    assert batches == [ManagedTrainingPlan(records, config, architecture="span").batch(i) for i in range(len(batches))]
    kept: set[tuple[str, ...]] = set()
    for batch in batches:
        for row, example in zip(batch.rows, batch.examples, strict=True):
            own = records[row]["output"]["entities"]
            asked = example["output"]["entities"]
            assert asked == {label: own[label] for label in asked}  # a subset, mentions untouched
            if batch.epoch >= 2 or len(own) == 1:
                assert asked == own
            else:
                assert 0 < len(asked) < len(own)
                kept.add(tuple(asked))
    assert len(kept) > 2  # different subsets across records and epochs
    off = TrainingConfig(**training_config(**settings, label_subset_prob=0.0))
    plain = ManagedTrainingPlan(records, off, architecture="span")
    assert all(
        [records[r] for r in b.rows] == [dict(e) for e in b.examples]
        for b in (plain.batch(i) for i in range(plain.batch_count))
    )
