"""A study on the fleet (slow; ``make test-fleet``): the tune deployment from prefect.yaml on a ``sweeps`` worker,
trials as flow runs of the training deployment on two training workers, two at once, the study in the Prefect
server's PostgreSQL, runs on S3. Its flow process is SIGKILLed mid-study and ``prefect flow-run retry`` continues it:
the study ends with its trials, no segment of a trial (run key and pause point) has a second flow run, and the
leaderboard ranks every trial."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from test_fleet import _cli, _kill_host, _leaderboard, _most_at_once, _state, _wait_final, _worker, fleet_server

from prefect_gliner2.flows.tune_study import optuna_module, own_schema, sync_url
from prefect_gliner2.flows.tune_trials import counted

from support.config import training_config
from support.flow import THREADS, make_inputs

__all__ = ["fleet_server"]  # the module's fixture: a Prefect server on PostgreSQL with the deployments

pytestmark = pytest.mark.fleet

SPACE = {
    "params": {"encoder_lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
    "pruner": {"type": "successive_halving", "min_resource": 2, "reduction_factor": 3},
    "sampler": {"type": "random"},
}


def test_a_study_on_two_workers_survives_its_flow_process_and_trains_nothing_twice(
    fleet_server: str, postgres_url: str, s3_bucket: str, tmp_path: Path
) -> None:
    inputs = make_inputs(tmp_path / "data")
    base = {
        "model": "tiny:span",
        "train_data": inputs["train"],
        "valid_data": inputs["valid"],
        "config": training_config(eval_strategy="steps", eval_steps=1, metric_for_best="eval_loss"),
        "storage": f"{s3_bucket}/runs",
        "execution": {"cpu_threads": THREADS},
    }
    params = {"base": base, "space": SPACE, "trials": 4, "study_key": "fleet-study", "parallel": 2}
    params |= {"study_storage_url": postgres_url, "poll_seconds": 1.0}
    logs = {name: tmp_path / f"{name}.log" for name in ("host-a", "host-b", "sweeper")}
    workers = [_worker(fleet_server, name, logs[name], {}, queue="default") for name in ("host-a", "host-b")]
    workers.append(_worker(fleet_server, "sweeper", logs["sweeper"], {}, queue="sweeps"))
    try:
        out = _cli(fleet_server, "deployment", "run", "gliner2-tune/tune", "--params", json.dumps(params))
        study_id = UUID(re.search(r"UUID: ([0-9a-f-]{36})", out).group(1))  # type: ignore[union-attr]
        _wait_until(lambda: len(_segments(fleet_server)) >= 2, 600, "the study's first two trials")
        os.kill(_wait_until(lambda: _flow_run_pid(study_id), 60, "the study's flow process"), signal.SIGKILL)
        _wait_until(lambda: _state(fleet_server, study_id).is_crashed(), 120, "the killed study marked CRASHED")
        _cli(fleet_server, "flow-run", "retry", str(study_id))
        state = _wait_final(fleet_server, study_id, timeout=1500)
        assert state is not None and state.is_completed(), (state, logs["sweeper"].read_text()[-4000:])
    finally:
        for worker in workers:
            _kill_host(worker)
            worker.wait(30)
    study = optuna_module().load_study(study_name="fleet-study", storage=own_schema(sync_url(postgres_url)))
    trials = study.get_trials()
    assert sum(counted(t) for t in trials) == 4 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    segments = _segments(fleet_server)
    names = collections.Counter(run.name for run in segments)
    assert all(count == 1 for count in names.values()), f"a segment trained twice: {names}"
    assert {run.parameters["run_key"] for run in segments} == {t.user_attrs["run_key"] for t in trials}
    assert _most_at_once(segments) == 2, [(r.name, r.start_time, r.end_time) for r in segments]
    assert all(re.search(r"submitting flow run", logs[name].read_text()) for name in ("host-a", "host-b"))
    rows = _leaderboard(fleet_server, "gliner2-tune-fleet-study-leaderboard")
    assert sorted(row["trial"] for row in rows) == [t.number for t in trials]
    assert all(row["flow_run"].startswith("http") for row in rows), rows


def _segments(api: str) -> list[Any]:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with SyncPrefectClient(api) as client:
        tags = FlowRunFilterTags(all_=["study:fleet-study"])
        return list(client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=tags)))


def _wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s")


def _flow_run_pid(flow_run_id: UUID) -> int | None:
    """The pid of the flow run's own process (its environment names the flow run; its parent's does not)."""
    wanted = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if wanted in handle.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    parents = {pid: _parent(pid) for pid in found}
    heads = [pid for pid in found if parents[pid] not in found]
    return heads[0] if heads else None


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
