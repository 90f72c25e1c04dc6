"""Optuna studies whose trials are training runs of a tiny model, in this process: pruning happens at validation
points, a pruned trial is paused at a checkpoint and continued to the bits of an unpruned run, and the study's
proposals follow its seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.tune import tune_flow
from prefect_gliner2.flows.tune_study import ask, open_study, optuna_module, study_resources
from prefect_gliner2.flows.tune_trials import counted
from prefect_gliner2.runtime.pause import run_outcome
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.search_space import parse_search_space

from support.config import training_config
from support.flow import THREADS, assert_same_export, make_space, reference_export

pytestmark = pytest.mark.usefixtures("prefect_server")

# 6 updates over 2 epochs, validated after every update; eval_loss: no ties between trials at a pause point
CONFIG = training_config(eval_strategy="steps", eval_steps=1, metric_for_best="eval_loss")
SPACE = {
    "params": {
        "encoder_lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "task_lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    },
    # pause points at 2 and 6 updates: a trial pauses once, after its validation at step 2, then trains to its end
    "pruner": {"type": "successive_halving", "min_resource": 2, "reduction_factor": 3},
    "sampler": {"type": "random"},
}
SEED = 0


def _base(space: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": space["span"],
        "train_data": space["inputs"]["train"],
        "valid_data": space["inputs"]["valid"],
        "config": CONFIG,
        "storage": str(space["root"] / "runs"),
        "execution": {"cpu_threads": THREADS},
    }


def _tune(space: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "base": _base(space),
        "space": SPACE,
        "trials": 3,
        "study_key": "tiny",
        "study_storage_url": f"sqlite:///{space['root']}/studies.db",
        "deployment": None,
        "seed": SEED,
    }
    return tune_flow(**{**params, **overrides})


def _trials(space: dict[str, Any]) -> list[Any]:
    optuna = optuna_module()
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{space['root']}/studies.db")
    return list(study.get_trials())


@pytest.fixture(scope="module")
def studied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    space = make_space(tmp_path_factory.mktemp("tune"))
    return {"space": space, "outcome": _tune(space)}


def test_a_study_prunes_at_a_pause_point_and_keeps_the_pruned_run_paused(studied: dict[str, Any]) -> None:
    space, outcome = studied["space"], studied["outcome"]
    trials = _trials(space)
    states = [t.state.name for t in trials]
    assert len(trials) == 3 and all(counted(t) for t in trials) and "PRUNED" in states and "COMPLETE" in states
    assert len({t.user_attrs["run_key"] for t in trials}) == 3
    for trial in trials:
        run_dir = RunDirectory(str(space["root"] / "runs"), trial.user_attrs["run_key"])
        kind, record = run_outcome(run_dir) or ("none", {})
        assert sorted(trial.intermediate_values) == [v["step"] for v in record["validations"]]
        if trial.state.name == "PRUNED":  # paused at its checkpoint after the validation at step 2, not lost
            assert kind == "paused" and record["total_steps"] == 2 and trial.user_attrs["steps"] == 2
            assert trial.user_attrs["checkpoint"] == record["checkpoint"] == "step-000002-batch-000003"
            assert (Path(record["run_dir"]) / "checkpoints" / record["checkpoint"] / "checkpoint.json").exists()
        else:
            assert kind == "finished" and trial.value == record["best_metric"] and trial.user_attrs["steps"] == 6
    rows = outcome["rows"]
    assert [row["trial"] for row in rows][0] == outcome["best"]["trial"]
    assert [row["state"] for row in rows] == sorted(states, key=lambda s: s != "COMPLETE")
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert outcome["best"]["value"] == min(t.value for t in complete)  # eval_loss: lower is better
    assert Path(outcome["best"]["export"], "export.json").exists()
    _assert_leaderboard(rows)


def _assert_leaderboard(rows: list[dict[str, Any]]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        [artifact] = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["gliner2-tune-tiny-leaderboard"]))
        )
    table = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert [row["trial"] for row in table] == [row["trial"] for row in rows]
    assert all(row["flow_run"] and row["steps"] in (2, 6) for row in table)


def test_a_pruned_trial_continued_by_its_number_equals_an_unpruned_run(studied: dict[str, Any]) -> None:
    space = studied["space"]
    pruned = next(t for t in _trials(space) if t.state.name == "PRUNED")
    outcome = _tune(space, continue_trials=[pruned.number])
    trials = _trials(space)
    [continued] = [t for t in trials if t.user_attrs.get("continues") == pruned.number]
    assert continued.state.name == "COMPLETE" and continued.params == pruned.params
    assert continued.user_attrs["run_key"] == pruned.user_attrs["run_key"] and len(trials) == 4
    run_dir = RunDirectory(str(space["root"] / "runs"), pruned.user_attrs["run_key"])
    kind, summary = run_outcome(run_dir) or ("none", {})
    assert kind == "finished" and summary["resumed_from_batch"] == 4  # from the pause checkpoint, not from scratch
    reference = reference_export(
        space["span"], space["inputs"], {**CONFIG, **pruned.params}, space["root"] / "unpruned"
    )
    assert_same_export(summary["export"], reference)
    notes = {row["trial"]: row["note"] for row in outcome["rows"]}
    assert notes[continued.number] == f"continues trial {pruned.number}"
    assert notes[pruned.number].endswith(f"continued by trial {continued.number}")
    registry = {"registry_root": str(space["root"] / "registry"), "model_name": "tuned"}
    again = _tune(space, continue_trials=[pruned.number], registry=registry)  # asked twice: continued once
    assert len(_trials(space)) == 4 and len(again["rows"]) == 4
    assert again["registered"]["new"] and again["registered"]["version"] == "v000001"
    lineage = json.loads((Path(again["registered"]["uri"]) / "lineage.json").read_text())
    assert (lineage["study_key"], lineage["trial"], lineage["value"]) == (
        "tiny",
        again["best"]["trial"],
        again["best"]["value"],
    )
    once = _tune(space, registry=registry)  # a study run again registers nothing twice
    assert once["registered"] == {**again["registered"], "new": False}


def test_one_slot_proposes_the_same_trials_in_the_same_order_for_a_seed(tmp_path: Path) -> None:
    """The sampler is seeded by the seed and the trial's number: two studies told the same values propose the
    same parameters, also when the second one is reopened (a restart) between trials."""
    space = parse_search_space({**SPACE, "sampler": {"type": "tpe", "n_startup_trials": 2}})
    from prefect_gliner2.flows.tune_study import Resources

    def proposals(url: str, reopen: bool) -> list[dict[str, Any]]:
        study = open_study("s", url, space, Resources(2, 6), {"k": 1}, maximize=False)
        seen = []
        for number in range(5):
            if reopen:
                study = open_study("s", url, space, Resources(2, 6), {"k": 1}, maximize=False)
            trial = ask(study, space, seed=7)
            seen.append(trial.params)
            study.tell(trial, sum(trial.params.values()) + number * 1e-3)
        assert study_resources(study).min_resource == 2
        return seen

    first = proposals(f"sqlite:///{tmp_path}/a.db", reopen=False)
    assert first == proposals(f"sqlite:///{tmp_path}/b.db", reopen=True)
    assert len({json.dumps(p, sort_keys=True) for p in first}) == 5


def test_the_study_promotes_the_furthest_trained_then_best_pruned_trials_once(tmp_path: Path) -> None:
    """Control flow only (no training): which pruned trials ``continue_best`` continues, and that an earlier
    promotion counts when the study runs again."""
    from prefect_gliner2.flows.tune_study import Resources, distributions
    from prefect_gliner2.flows.tune_trials import StudyRunner

    optuna = optuna_module()
    space = parse_search_space(SPACE)
    study = open_study("p", f"sqlite:///{tmp_path}/p.db", space, Resources(2, 6), {"k": 1}, maximize=False)
    pruned = [({1: 0.5, 2: 0.4}, 0.1), ({1: 0.3, 2: 0.2}, 0.2), ({1: 0.1}, 0.3), ({1: 0.6, 2: float("nan")}, 0.4)]
    for values, lr in pruned:  # eval_loss: lower is better
        params = {"encoder_lr": lr * 1e-1, "task_lr": lr * 1e-1}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=distributions(space),
                intermediate_values=values,
                state=optuna.trial.TrialState.PRUNED,
            )
        )
    runner = StudyRunner(study, space, {}, "p", seed=0, launcher=None, trials=4, greater=False)
    assert runner._promote(2)
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs["continues"] for t in waiting] == [1, 0]  # step 2 first (0.2 < 0.4, NaN last), then step 1
    assert all(t.user_attrs["promoted"] and t.user_attrs["prune"] is False for t in waiting)
    assert not runner._promote(2), "promoted by an earlier run of the study: not again"
