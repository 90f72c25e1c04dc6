"""A run paused at a validation point (``pause_at_step``) is checkpointed there and continued exactly by its run key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefect_gliner2.runtime.pause import pause_index, run_outcome
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.training.tiny import tiny_records

from support.config import training_config
from support.flow import assert_same_export, make_space, reference_export, run_flow

pytestmark = pytest.mark.usefixtures("prefect_server")

# 12 records, 2 per batch, 2 batches per update: 3 updates per epoch, 2 epochs; validation every 2 updates
CONFIG = training_config(eval_strategy="steps", eval_steps=2)


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("pause"))


def test_the_pause_point_is_the_first_validation_at_or_after_the_budget_before_the_last_batch() -> None:
    plan = ManagedTrainingPlan(tiny_records(12, seed=5), TrainingConfig.from_dict(CONFIG), architecture="span")
    assert [plan.step_after(i) for i in plan.validations()] == [2, 4, 6]
    assert [pause_index(plan, 0, step) for step in (1, 2, 3, 4)] == [3, 3, 7, 7]
    assert pause_index(plan, 4, 1) == 7  # from batch 4 on, the next validation
    assert pause_index(plan, 0, 5) is None  # the next validation ends the plan: the run goes to its end


def test_a_paused_run_continues_to_the_bits_of_an_unpaused_one(space: dict[str, Any]) -> None:
    storage = str(space["root"] / "runs")
    params = {
        "model": space["span"],
        "train_data": space["inputs"]["train"],
        "valid_data": space["inputs"]["valid"],
        "config": CONFIG,
        "run_key": "paused",
        "storage": storage,
        "checkpointing": {"checkpoint_every": 3},  # no scheduled checkpoint at the pause: one is added there
    }
    first = run_flow(**params, pause_at_step=1)
    assert first["paused"] and first["total_steps"] == 2 and first["max_steps"] == 6, first
    assert [entry["step"] for entry in first["validations"]] == [2]
    assert first["checkpoint"] == "step-000002-batch-000003" and first["cursor"] == 4
    run_dir = RunDirectory(storage, "paused")
    outcome = run_outcome(run_dir)
    assert outcome is not None and outcome[0] == "paused" and outcome[1]["total_steps"] == 2
    assert not (space["root"] / "runs" / "paused" / "export").exists(), "a paused run exports nothing"

    again = run_flow(model=space["span"], run_key="paused", storage=storage, pause_at_step=2)
    same = ("flow_run_id",)
    assert {k: v for k, v in again.items() if k not in same} == {k: v for k, v in first.items() if k not in same}

    second = run_flow(model=space["span"], run_key="paused", storage=storage, pause_at_step=3)
    assert second["total_steps"] == 4 and [e["step"] for e in second["validations"]] == [2, 4]
    assert second["validations"][0] == first["validations"][0]

    done = run_flow(model=space["span"], run_key="paused", storage=storage)
    assert not done.get("paused") and done["total_steps"] == 6 and done["resumed_from_batch"] == 8
    assert [entry["step"] for entry in done["validations"]] == [2, 4, 6]
    outcome = run_outcome(run_dir)
    assert outcome is not None and outcome[0] == "finished" and outcome[1]["best_metric"] == done["best_metric"]
    cursor = json.loads((space["root"] / "runs" / "paused" / "cursor.json").read_text())
    assert cursor["finished"] and not cursor["summary"].get("paused")
    reference = reference_export(space["span"], space["inputs"], CONFIG, space["root"] / "ref-paused")
    assert_same_export(done["export"], reference)


def test_a_pause_without_validation_is_refused(space: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="pause_at_step pauses a run at a validation point"):
        run_flow(
            model=space["span"],
            train_data=space["inputs"]["train"],
            config=training_config(eval_strategy="no"),
            run_key="no-valid",
            storage=str(space["root"] / "runs"),
            pause_at_step=1,
        )
