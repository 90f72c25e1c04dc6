"""The flow's unit schedule (runtime/schedule.py) on real torch-free plans: no model, no worker, no Prefect server."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from prefect_gliner2.runtime.protocol import Advance, Checkpoint, Validate
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.schedule import (
    AUTO_PIPELINE_DEPTH,
    TARGET_TASK_SECONDS,
    CheckpointCadence,
    TaskGrain,
    Unit,
    is_checkpoint_point,
    pipeline_depth,
    unit_op,
    units,
)
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.training.tiny import tiny_records

from support.config import training_config


def _plan(n: int = 12, **overrides: Any) -> ManagedTrainingPlan:
    """12 records, batch 2, accumulation 2, 2 epochs (the flow tests' plan): 12 batches, updates after odd ones."""
    return ManagedTrainingPlan(tiny_records(n, seed=5), TrainingConfig(**training_config(**overrides)), "span")


def test_units_never_straddle_validation_or_checkpoints() -> None:
    plan = _plan()
    found = list(units(plan, 4, batches_per_task=3, checkpoint_every=2, validate=True))
    assert found == [
        Unit("advance", 4, 5),
        Unit("validate", 5, 5),
        Unit("checkpoint", 5, 5, 3),
        Unit("advance", 6, 7),
        Unit("checkpoint", 7, 7, 4),
        Unit("advance", 8, 10),
        Unit("advance", 11, 11),
        Unit("validate", 11, 11),
        Unit("checkpoint", 11, 11, 6),
    ]
    per_batch = list(units(plan, 0, batches_per_task=1, checkpoint_every=0, validate=False))
    assert [u.through for u in per_batch if u.kind == "advance"] == list(range(12))
    assert [u.through for u in per_batch if u.kind == "checkpoint"] == [5, 11]


def test_checkpoint_points_are_epoch_ends_and_every_nth_update() -> None:
    plan = _plan()
    assert [i for i in range(12) if is_checkpoint_point(plan, i, 0)] == [5, 11]  # epoch ends only
    assert [i for i in range(12) if is_checkpoint_point(plan, i, 1)] == [1, 3, 5, 7, 9, 11]  # every update
    assert [i for i in range(12) if is_checkpoint_point(plan, i, 2)] == [3, 5, 7, 11]  # steps 2, 4, 6 + epoch end
    uneven = _plan(10, gradient_accumulation_steps=3)  # 5 batches per epoch: windows 3 + 2 (the last one flushed)
    assert [i for i in range(10) if uneven.is_update(i)] == [2, 4, 7, 9]
    assert [i for i in range(10) if is_checkpoint_point(uneven, i, 3)] == [4, 7, 9]  # step 3 is batch 7's update


SHAPES = [
    {},
    {"gradient_accumulation_steps": 3},
    {"gradient_accumulation_steps": 1, "num_epochs": 3},
    {"eval_strategy": "steps", "eval_steps": 2},
    {"eval_strategy": "no", "batch_size": 3},
]


# (plan shape, batches per task, checkpoint every n updates, validate)
CASES = list(itertools.product(SHAPES, (1, 2, 5, 100), (0, 1, 3), (True, False)))


@pytest.mark.parametrize(("shape", "per_task", "every", "validate"), CASES)
def test_units_cover_the_plan_once_in_order_with_every_point_in_place(
    shape: dict[str, Any], per_task: int, every: int, validate: bool
) -> None:
    plan = _plan(11, **shape)
    for start in range(plan.batch_count):
        found = list(units(plan, start, batches_per_task=per_task, checkpoint_every=every, validate=validate))
        advances = [u for u in found if u.kind == "advance"]
        assert [i for u in advances for i in range(u.first, u.through + 1)] == list(range(start, plan.batch_count))
        assert all(1 <= u.through - u.first + 1 <= per_task for u in advances)
        for u in advances:  # a validation or checkpoint point can only be the last batch of an advance
            inner = range(u.first, u.through)
            assert not any(is_checkpoint_point(plan, i, every) or (validate and plan.is_validation(i)) for i in inner)
        expected: list[Unit] = []
        for i in range(start, plan.batch_count):
            if validate and plan.is_validation(i):
                expected.append(Unit("validate", i, i))
            if is_checkpoint_point(plan, i, every):
                expected.append(Unit("checkpoint", i, i, plan.step_after(i)))
        assert [u for u in found if u.kind != "advance"] == expected
        for position, unit in enumerate(found):  # each point right after the advance (or validation) it follows
            if unit.kind != "advance":
                before = found[position - 1]
                assert before.through == unit.through and (before.kind, unit.kind) != ("checkpoint", "validate")
        assert found[-1] == Unit("checkpoint", plan.batch_count - 1, plan.batch_count - 1, plan.max_steps)


@pytest.mark.parametrize("per_task", [1, 3, 100])
def test_resuming_after_a_checkpoint_continues_the_same_schedule(per_task: int) -> None:
    """From the batch after any checkpoint, the units are exactly the rest of an uninterrupted run's units."""
    plan = _plan(11, gradient_accumulation_steps=3)
    full = list(units(plan, 0, batches_per_task=per_task, checkpoint_every=1, validate=True))
    for position, unit in enumerate(full[:-1]):
        if unit.kind == "checkpoint":
            resumed = units(plan, unit.through + 1, batches_per_task=per_task, checkpoint_every=1, validate=True)
            assert list(resumed) == full[position + 1 :], f"resumed after {unit}"


def test_units_are_lazy_and_empty_at_the_end() -> None:
    plan = _plan()
    lazy = units(plan, 0, batches_per_task=1, checkpoint_every=0, validate=True)
    assert iter(lazy) is lazy and next(lazy) == Unit("advance", 0, 0)
    assert list(units(plan, plan.batch_count, batches_per_task=1, checkpoint_every=0, validate=True)) == []


def test_unit_op_is_the_worker_operation_of_a_unit(tmp_path: Any) -> None:
    run_dir = RunDirectory(str(tmp_path), "r")
    assert unit_op(Unit("advance", 4, 6), run_dir) == Advance(first=4, through=6)
    assert unit_op(Unit("validate", 5, 5), run_dir) == Validate(index=5)
    request = unit_op(Unit("checkpoint", 5, 5, 3), run_dir)
    assert isinstance(request, Checkpoint) and request.index == 5
    assert request.uri == run_dir.checkpoint_uri("step-000003-batch-000005")
    assert request.uri.endswith("/r/checkpoints/step-000003-batch-000005")


# ---- the task grain ---------------------------------------------------------------------------------------------


def test_an_automatic_grain_grows_from_one_batch_to_the_target_and_follows_slower_steps() -> None:
    assert TARGET_TASK_SECONDS == 5.0  # the default the figures below follow
    grain = TaskGrain()
    assert grain.pinned is None and grain.batches == 1 and grain.per_batch_seconds is None
    sizes = []
    for _ in range(7):  # 1/64 s per batch: wants 320 batches for 5 s tasks, at most x4 per measured unit
        grain.observe(grain.batches, grain.batches / 64)
        sizes.append(grain.batches)
    assert sizes == [4, 16, 64, 256, 320, 320, 320] and grain.per_batch_seconds == 1 / 64
    grain.observe(10, 10 * 7 / 64)  # steps got slower (the mean with the estimate: 1/16 s): fewer batches at once
    assert grain.batches == 80
    grain.observe(0, 0.0)  # an operation that trained nothing (already past) tells nothing
    assert grain.batches == 80
    one_second = TaskGrain(target_seconds=2.0)
    one_second.observe(1, 1.5)  # steps of 1.5 s: two batches per task at most
    assert one_second.batches == 2
    capped = TaskGrain(maximum=50)
    for _ in range(5):
        capped.observe(capped.batches, 0.001 * capped.batches)
    assert capped.batches == 50


def test_a_pinned_grain_ignores_measurements_and_settings_map_to_grains() -> None:
    pinned = TaskGrain(3)
    pinned.observe(3, 0.0003)
    assert pinned.batches == 3
    assert TaskGrain.of("auto").pinned is None and TaskGrain.of(7).batches == 7
    assert pipeline_depth("auto") == AUTO_PIPELINE_DEPTH and pipeline_depth(0) == 0
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match="positive int or 'auto'"):
            TaskGrain(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_units_of_a_growing_grain_cover_the_plan_in_order_and_keep_every_boundary(seed: int) -> None:
    import random

    rng = random.Random(seed)
    plan = _plan(40, num_epochs=3, eval_strategy="steps", eval_steps=3)
    every = rng.choice([0, 1, 2, 5])
    grain = TaskGrain(target_seconds=rng.choice([0.05, 1.0, 100.0]))
    found, covered = [], []
    for unit in units(plan, 0, batches_per_task=grain, checkpoint_every=every, validate=True):
        found.append(unit)
        if unit.kind == "advance":
            covered.extend(range(unit.first, unit.through + 1))
            grain.observe(unit.through - unit.first + 1, rng.uniform(0.001, 0.05) * (unit.through - unit.first + 1))
    assert covered == list(range(plan.batch_count))  # every batch once, in order, whatever the grouping
    fixed = list(units(plan, 0, batches_per_task=1, checkpoint_every=every, validate=True))
    assert [u for u in found if u.kind != "advance"] == [u for u in fixed if u.kind != "advance"]
    ends = {u.through for u in found if u.kind == "advance"}
    assert {u.through for u in fixed if u.kind != "advance"} <= ends  # validations and checkpoints end units
    assert max(u.through - u.first + 1 for u in found if u.kind == "advance") > 1  # it did group


def _big_plan(batches: int) -> ManagedTrainingPlan:
    """One epoch of `batches` batches of one record, one update per batch (step = batch + 1)."""
    return _plan(batches, batch_size=1, gradient_accumulation_steps=1, num_epochs=1)


def _checkpoints(plan: ManagedTrainingPlan, start: int, cadence: CheckpointCadence, grain: TaskGrain) -> list[int]:
    found = units(plan, start, batches_per_task=grain, checkpoint_every=cadence, validate=False)
    return [u.step for u in found if u.kind == "checkpoint"]


def test_the_automatic_cadence_checkpoints_every_100_updates_at_0_3_s_steps_and_30_s_apart_at_short_ones() -> None:
    plan = _big_plan(3200)
    unmeasured = TaskGrain()
    assert _checkpoints(plan, 0, CheckpointCadence.of("auto", unmeasured), unmeasured) == [*range(100, 3200, 100), 3200]
    for per_batch, every in ((0.3, 100), (0.02, 1500), (0.05, 600), (0.1, 300), (1.0, 100)):
        grain = TaskGrain(target_seconds=1e9)  # measured once here; a bench-sized target keeps units long
        grain.observe(100, 100 * per_batch)
        steps = _checkpoints(plan, 0, CheckpointCadence.of("auto", grain), grain)
        assert steps == [*range(every, 3200, every), 3200], per_batch  # the epoch end always checkpoints
        assert all((b - a) * per_batch >= 30.0 for a, b in itertools.pairwise([0, *steps[:-1]]))
    # a resumed attempt counts from where it starts (the restored checkpoint)
    grain = TaskGrain()
    grain.observe(10, 0.2)
    assert _checkpoints(plan, 1000, CheckpointCadence.of("auto", grain), grain) == [2500, 3200]
    # a pinned cadence is the positional one, whatever the measurement
    assert _checkpoints(plan, 0, CheckpointCadence.of(800, grain), grain) == [800, 1600, 2400, 3200]
    assert _checkpoints(plan, 0, CheckpointCadence.of(0, grain), grain) == [3200]


def test_the_automatic_cadence_follows_the_grain_as_it_is_measured() -> None:
    """A grain that learns 20 ms per batch early spaces checkpoints ~30 s apart from then on; training slowing
    down to 1 s per batch brings the cadence back to every 100 updates."""
    plan = _big_plan(3000)
    grain = TaskGrain(target_seconds=2.0)
    cadence = CheckpointCadence.of("auto", grain)
    steps = []
    for unit in units(plan, 0, batches_per_task=grain, checkpoint_every=cadence, validate=False):
        if unit.kind == "advance":
            per_batch = 0.02 if unit.through < 2000 else 1.0
            grain.observe(unit.through - unit.first + 1, per_batch * (unit.through - unit.first + 1))
        elif unit.kind == "checkpoint":
            steps.append(unit.step)
    assert steps[:1] == [1500] and steps[-1] == 3000
    assert [s for s in steps if s > 2100] == [*range(2200, 3001, 100)]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "often"])
def test_a_bad_checkpoint_cadence_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="non-negative int or 'auto'"):
        CheckpointCadence(bad)
