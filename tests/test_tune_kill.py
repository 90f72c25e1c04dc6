"""A study SIGKILLed mid-trial and run again with the same command completes with its N trials, trains no batch
twice but those after the killed trial's last checkpoint, and continues the killed trial from that checkpoint."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.tune_study import optuna_module
from prefect_gliner2.flows.tune_trials import counted
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.pause import run_outcome
from prefect_gliner2.runtime.rundir import RunDirectory

from support.config import training_config
from support.flow import FAULT_SITE, ROOT, make_space

SPACE = """\
params:
  encoder_lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  task_lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
pruner: {type: successive_halving, min_resource: 2, reduction_factor: 3}
sampler: {type: random}
"""
KILL_AT = 4  # the first unit after trial 0's pause checkpoint (step 2, batch 3): batch 4, one batch per task


def _command(space: dict[str, Any], root: Path) -> list[str]:
    (root / "config.json").write_text(
        json.dumps(training_config(eval_strategy="steps", eval_steps=1, metric_for_best="eval_loss"))
    )
    (root / "space.yaml").write_text(SPACE)
    argv = [sys.executable, "-m", "prefect_gliner2.flows.cli", "tune", "--model", space["span"]]
    argv += ["--train", space["inputs"]["train"], "--valid", space["inputs"]["valid"]]
    argv += ["--config", str(root / "config.json"), "--space", str(root / "space.yaml"), "--trials", "2"]
    argv += ["--study-key", "killed", "--storage", f"sqlite:///{root}/studies.db", "--run-storage", str(root / "runs")]
    return argv + ["--cpu-threads", "1", "--batches-per-task", "1", "--json"]


def _study(root: Path) -> Any:
    return optuna_module().load_study(study_name="killed", storage=f"sqlite:///{root}/studies.db")


def test_a_killed_study_run_again_completes_without_training_anything_twice(
    prefect_server: str, tmp_path: Path
) -> None:
    space = make_space(tmp_path)
    argv = _command(space, tmp_path)
    plan = FaultPlan((Fault.kill("unit", KILL_AT, once=str(tmp_path / "killed")),))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAULT_SITE), str(ROOT)]), PREFECT_API_URL=prefect_server)
    killed = subprocess.run(argv, env={**env, "SUPPORT_FAULT_PLAN": plan.to_json()}, capture_output=True, text=True)
    assert killed.returncode == -9 and (tmp_path / "killed").exists(), killed.stdout + killed.stderr[-3000:]
    [running] = _study(tmp_path).get_trials(deepcopy=False)
    assert running.state.name == "RUNNING" and sorted(running.intermediate_values) == [1, 2]

    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr[-4000:]
    trials = _study(tmp_path).get_trials(deepcopy=False)
    assert len(trials) == 2 and all(counted(t) and t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    assert trials[0].state.name == "COMPLETE", "alone at its pause point, trial 0 is never pruned"
    assert trials[0].params == running.params and sorted(trials[0].intermediate_values) == [1, 2, 3, 4, 5, 6]
    keys = [t.user_attrs["run_key"] for t in trials]
    outcome = run_outcome(RunDirectory(str(tmp_path / "runs"), keys[0]))
    assert outcome is not None and outcome[0] == "finished" and outcome[1]["resumed_from_batch"] == KILL_AT

    killed_run, other = _trained_batches(keys[0]), _trained_batches(keys[1])
    # before its checkpoint: never again (the killed process may not have sent every task run's events)
    assert all(killed_run[i] <= 1 for i in range(KILL_AT)) and killed_run[0] == 1, killed_run
    assert 1 <= killed_run[KILL_AT] <= 2, killed_run  # trained when the kill came, and again after it
    assert [killed_run[i] for i in range(KILL_AT + 1, 12)] == [1] * (12 - KILL_AT - 1), killed_run
    last = 4 if trials[1].state.name == "PRUNED" else 12
    assert sorted(other) == list(range(last)) and set(other.values()) == {1}, other
    rows = json.loads(again.stdout)["rows"]
    assert sorted(row["trial"] for row in rows) == [0, 1]


def _trained_batches(run_key: str, timeout: float = 60.0) -> collections.Counter[int]:
    """How often each batch of the run was trained, over every flow run of the run key (its ``batches i-j`` task
    runs that completed; the server records them from events, so wait until the count settles)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId

    deadline, previous = time.monotonic() + timeout, None
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["gliner2-train"])))
            ids = [run.id for run in runs if run.parameters.get("run_key") == run_key]
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        counts: collections.Counter[int] = collections.Counter()
        for task in tasks:
            if task.name.startswith("batches ") and task.state is not None and task.state.is_completed():
                first, through = (int(n) for n in task.name.split()[1].split("-"))
                counts.update(range(first, through + 1))
        if counts == previous or time.monotonic() > deadline:
            return counts
        previous = counts
        time.sleep(2.0)


pytestmark = pytest.mark.timeout(1200)
