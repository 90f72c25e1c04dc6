"""A sweep survives its own crash and its points' crashes: served deployments on the loopback Prefect server.

The sweep deployment's flow process is SIGKILLed after it submitted its first points, and ``prefect flow-run retry``
resumes it: the points already running or completed are adopted (the same flow runs), none is started twice, and
the leaderboard lists every point. A point crashed while the sweep was dead is retried when it resumes, one that
crashes while the sweep waits is retried by the sweep's loop, and both export the bits of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.flows.sweep import SweepIncompleteError, sweep_outcome, sweep_points
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.session_core.errors import ConfigError

from support.config import training_config
from support.flow import FAULT_SITE, ROOT, THREADS, assert_same_export, make_inputs, reference_export
from support.prefect_harness import delete_deployments
from support.processes import serving

TRAIN, SWEEP = "gliner2-train/train", "gliner2-sweep/sweep"
SWEEP_KEY = "crashy"
PAUSE = 2.5  # every training run pauses this long at its cursor move after batch 3: the window for a real kill


BASE = {"model": "tiny:span", "train_data": "data/train.jsonl", "config": training_config()}


def test_a_points_run_key_names_what_it_trains_on() -> None:
    grid = sweep_points(BASE, {"seed": [1, 2], "encoder_lr": [1e-3, 3e-4]}, None, "g")
    assert len(grid) == 4 and len({point["run_key"] for point in grid}) == 4
    assert [p["run_key"] for p in grid] == [
        p["run_key"] for p in sweep_points(BASE, {"seed": [1, 2], "encoder_lr": [1e-3, 3e-4]}, None, "g")
    ]
    assert {p["config"]["seed"] for p in grid} == {1, 2} and all(p["run_key"].startswith("g-") for p in grid)
    [one] = sweep_points(BASE, None, [{"seed": 1}], "g")
    [other_data] = sweep_points({**BASE, "train_data": "data/other.jsonl"}, None, [{"seed": 1}], "g")
    [other_epochs] = sweep_points({**BASE, "config": training_config(num_epochs=5)}, None, [{"seed": 1}], "g")
    assert len({one["run_key"], other_data["run_key"], other_epochs["run_key"]}) == 3  # no stale adoption
    assert one["form"]["seed"] == 1 and one["form"]["precision"] == "fp32"  # what the run form takes


@pytest.mark.parametrize(
    ("base", "grid", "points", "message"),
    [
        ({**BASE, "run_key": "mine"}, None, [{"seed": 1}], r"base sets \['run_key'\].*own run key"),
        ({**BASE, "export_to": "/models/x"}, None, [{"seed": 1}], r"base sets \['export_to'\]"),
        (BASE, {"seed": [1]}, [{"seed": 1}], "exactly one of grid"),
        (BASE, None, None, "exactly one of grid"),
        (BASE, {"seed": []}, None, r"grid fields \['seed'\] need a non-empty list"),
        (BASE, None, [], "no points"),
        (BASE, None, [{"seed": 1}, {"seed": 1, "num_epochs": 2}], "point 1 .* trains what an earlier point does"),
        (BASE, None, [{"batch_size": 0}], r"sweep point 0 \{'batch_size': 0\}"),
    ],
)
def test_bad_sweeps_are_refused_saying_why(base: Any, grid: Any, points: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sweep_points(base, grid, points, "g")


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


@pytest.fixture()
def served_with_pause(prefect_server: str, tmp_path: Path) -> Iterator[Path]:
    """The deployments served (``deployments/serve.py``), every flow run pausing at cursor 3 (markers/cursor-3)."""
    delete_deployments(TRAIN, SWEEP, "gliner2-retrain/retrain-nightly")
    markers = tmp_path / "markers"
    markers.mkdir()
    plan = FaultPlan((Fault.pause("cursor", 3, PAUSE),), markers=str(markers))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(FAULT_SITE), str(ROOT)]),
        PREFECT_API_URL=prefect_server,
        PREFECT_RUNNER_POLL_FREQUENCY="1",
        SUPPORT_FAULT_PLAN=plan.to_json(),
    )
    with serving([sys.executable, "-m", "prefect_gliner2.deployments.serve"], env, tmp_path / "serve.log"):
        yield markers


def _wait_until(check: Any, timeout: float, what: str, process: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args!r} exited ({process.returncode}) while waiting for {what}")
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s")


def _flow_run_pid(flow_run_id: UUID) -> int | None:
    """The pid of the flow run's own process (the one whose parent does not carry the same flow run id)."""
    wanted = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    found = [pid for pid in _pids() if wanted in _environ(pid)]
    heads = [pid for pid in found if _parent(pid) not in found]
    return heads[0] if heads else None


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _point_runs() -> dict[str, Any]:
    """The sweep's point flow runs by run key; fails on a duplicate (two flow runs for one point)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with _client() as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"sweep:{SWEEP_KEY}"])))
    keys = [run.parameters["run_key"] for run in runs]
    assert len(keys) == len(set(keys)), f"a point was started twice: {sorted(keys)}"
    return {run.parameters["run_key"]: run for run in runs}


def _read(flow_run_id: UUID) -> Any:
    with _client() as client:
        return client.read_flow_run(flow_run_id)


def _kill_at_pause(runs: Path, run_key: str, flow_run_id: UUID) -> None:
    """SIGKILL the point's flow process while it pauses at cursor 3: its checkpoint after batch 3 is committed,
    cursor.json still says 2 (the pause lasts PAUSE seconds)."""

    def paused() -> int | None:
        run = runs / run_key
        committed = list(run.glob("checkpoints/*-batch-000003/checkpoint.json"))
        cursor = json.loads((run / "cursor.json").read_text()) if (run / "cursor.json").exists() else None
        return _flow_run_pid(flow_run_id) if committed and cursor is not None and cursor["cursor"] < 4 else None

    os.kill(_wait_until(paused, 180, f"point {run_key} pausing at cursor 3"), signal.SIGKILL)
    # the state history, not the current state: a live sweep may retry the crashed run before we look
    _wait_until(lambda: "CRASHED" in _states(flow_run_id), 60, f"point {run_key} marked CRASHED")


def test_a_sweep_with_a_point_that_did_not_complete_fails_naming_it() -> None:
    rows = [{"run_key": "s-a", "state": "COMPLETED"}, {"run_key": "s-b", "state": "CRASHED"}]
    with pytest.raises(SweepIncompleteError, match=r"1 of 2 point\(s\) did not complete: s-b \(CRASHED\)"):
        sweep_outcome("s", rows)
    assert sweep_outcome("s", rows[:1]) == {"sweep_key": "s", "rows": rows[:1], "failed": []}


def _states(flow_run_id: UUID) -> list[str]:
    with _client() as client:
        return [state.type.value for state in client.read_flow_run_states(flow_run_id)]


@pytest.mark.fleet  # served deployments running four points two at a time with kills: ~2 min, `make test-fleet`
def test_a_killed_sweep_resumes_without_duplicates_and_crashed_points_resume_exactly(
    served_with_pause: Path, prefect_server: str, tmp_path: Path
) -> None:
    del served_with_pause  # the deployments are served, every training run pausing at cursor 3
    from prefect.deployments import run_deployment

    inputs = make_inputs(tmp_path / "data")
    base = {
        "model": "tiny:span",
        "train_data": inputs["train"],
        "valid_data": inputs["valid"],
        "config": training_config(metric_for_best="eval_loss"),
        "storage": str(tmp_path / "runs"),
        "checkpointing": {"checkpoint_every": 1},
        "execution": {"cpu_threads": THREADS},
    }
    points = [{"seed": seed} for seed in (1, 2, 3, 4)]
    params = {"base": base, "points": points, "sweep_key": SWEEP_KEY, "max_parallel": 2, "poll_seconds": 0.5}
    sweep = run_deployment(SWEEP, parameters=params, timeout=0)

    first = _wait_until(lambda: len(_point_runs()) >= 2 and _point_runs(), 120, "the sweep's first two points")
    os.kill(_wait_until(lambda: _flow_run_pid(sweep.id), 30, "the sweep's flow process"), signal.SIGKILL)
    _wait_until(lambda: _read(sweep.id).state.is_crashed(), 60, "the killed sweep marked CRASHED")
    assert sorted(_point_runs()) == sorted(first), "max_parallel=2: only two points before the kill"

    crashed_while_dead, adopted = sorted(first)
    _kill_at_pause(
        tmp_path / "runs", crashed_while_dead, first[crashed_while_dead].id
    )  # this point crashes while no sweep watches it

    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "flow-run", "retry", str(sweep.id)],
        env=dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=prefect_server),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    later = _wait_until(lambda: len(_point_runs()) >= 3 and _point_runs(), 240, "the resumed sweep's third point")
    crashed_while_waiting = sorted(set(later) - set(first))[0]
    _kill_at_pause(
        tmp_path / "runs", crashed_while_waiting, later[crashed_while_waiting].id
    )  # this one crashes while the resumed sweep waits

    state = _wait_until(lambda: _read(sweep.id).state.is_final() and _read(sweep.id).state, 400, "the sweep's end")
    assert state.is_completed(), (state, (tmp_path / "serve.log").read_text()[-4000:])
    runs = _point_runs()
    assert sorted(runs) == sorted(point["run_key"] for point in sweep_points(base, None, points, SWEEP_KEY))
    assert all(runs[key].id == first[key].id for key in first), "the resumed sweep adopted its earlier flow runs"
    assert all(run.state.is_completed() for run in runs.values()), {k: r.state for k, r in runs.items()}
    for key in (crashed_while_dead, crashed_while_waiting):
        assert "CRASHED" in _states(runs[key].id) and runs[key].run_count == 2, (key, _states(runs[key].id))
    others = set(runs) - {crashed_while_dead, crashed_while_waiting}
    assert all(runs[key].run_count == 1 and "CRASHED" not in _states(runs[key].id) for key in others)

    _assert_leaderboard(runs)
    configs = {point["run_key"]: point["config"] for point in sweep_points(base, None, points, SWEEP_KEY)}
    for key in (crashed_while_dead, crashed_while_waiting):
        reference = reference_export("tiny:span", inputs, configs[key], tmp_path / f"reference-{key}")
        assert_same_export(str(tmp_path / "runs" / key / "export"), reference)


def _assert_leaderboard(runs: dict[str, Any]) -> None:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with _client() as client:
        [artifact] = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"gliner2-sweep-{SWEEP_KEY}-leaderboard"]))
        )
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert sorted(row["run_key"] for row in rows) == sorted(runs)
    metrics = [row["best_metric"] for row in rows]
    assert len(set(metrics) - {None}) == 4 and metrics == sorted(metrics), metrics  # eval_loss: lower is better
    assert [row["rank"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        assert str(runs[row["run_key"]].id) in row["flow_run"] and row["flow_run"].startswith("http"), row
        assert str(row["export"]).endswith(f"{row['run_key']}/export") and row["state"] == "COMPLETED", row
