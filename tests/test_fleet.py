"""A fleet on loopback (slow; ``make test-fleet``): a Prefect server on PostgreSQL, process workers, S3 storage.

Lost-host recovery end to end: a worker host running a training flow dies (worker, flow process and session worker
killed together), the shipped automation (deployments/automations.yaml) marks the silent run CRASHED within a
bounded time, and ``prefect flow-run retry`` runs it on a second worker, which takes the lease over and finishes
with the bits of an uninterrupted run.

A sweep as users run it: the sweep deployment from prefect.yaml, started with ``prefect deployment run``, executed
by a worker on the ``sweeps`` queue, fans 4 run keys out to two training workers (``--work-queue default --limit
1``): all 4 complete with exports, the server's start/end times show 2 training at once, both workers' logs show
their share, no point has a second flow run, and the leaderboard artifact ranks all 4 with links.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.flows.params import TrainingSettings
from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.config import training_config
from support.flow import FAULT_SITE, ROOT, THREADS, assert_same_export, make_inputs, reference_export, wait_for_marker
from support.services import _stop, _wait_http, free_port, fresh_database

pytestmark = pytest.mark.fleet

CRASH_BOUND_S = 90 + 60  # three missed 30 s heartbeats, plus the trigger service's evaluation and our polling


def _cli(api: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def fleet_server(postgres_url: str) -> Iterator[str]:
    """`prefect server start` on the Postgres cluster, with the gliner2 deployments and automation."""
    port = free_port()
    home = tempfile.mkdtemp(prefix="prefect-fleet-home-")
    env = {
        **os.environ,
        "PREFECT_HOME": home,
        "PREFECT_API_DATABASE_CONNECTION_URL": fresh_database(postgres_url),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    log = open(Path(home) / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_http(f"{api}/health", server, timeout=180)  # type: ignore[arg-type]
        _cli(api, "work-pool", "create", "gliner2-process", "--type", "process")
        _cli(api, "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
        _cli(api, "automation", "create", "--from-file", "deployments/automations.yaml")
        yield api
    finally:
        _stop(server)  # type: ignore[arg-type]
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def _worker(api: str, name: str, log: Path, env: dict[str, str], queue: str | None = None) -> subprocess.Popen[bytes]:
    """A process worker (one slot; every queue of the pool unless `queue`) in its own process group."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            "gliner2-process",
            "--limit",
            "1",
            "--name",
            name,
            *(("--work-queue", queue) if queue else ()),
        ],
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": "1", **env},
        stdout=open(log, "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _kill_host(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and every process below it in one sweep, as a machine's death would."""
    for pid in _descendants(worker.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _state(api: str, flow_run_id: UUID) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(api) as client:
        return client.read_flow_run(flow_run_id).state


def test_a_lost_host_is_marked_crashed_and_its_retry_on_another_worker_resumes_exactly(
    fleet_server: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    from prefect.client.orchestration import SyncPrefectClient

    inputs = make_inputs(tmp_path / "data")
    cfg = training_config(num_epochs=3)
    markers = tmp_path / "markers"
    markers.mkdir()
    host_a = _worker(
        fleet_server,
        "host-a",
        tmp_path / "a.log",
        {
            "PYTHONPATH": os.pathsep.join([str(FAULT_SITE), str(ROOT)]),
            "SUPPORT_FAULT_PLAN": FaultPlan((Fault.pause("batch", 9, 600),), markers=str(markers)).to_json(),
        },
    )
    host_b: subprocess.Popen[bytes] | None = None
    try:  # from here on, whatever fails: the workers (and the flow paused on host-a) are killed below
        with SyncPrefectClient(fleet_server) as client:
            deployment = client.read_deployment_by_name("gliner2-train/train")
            run = client.create_flow_run_from_deployment(
                deployment.id,
                parameters={
                    "model": "tiny:span",
                    "train_data": inputs["train"],
                    "valid_data": inputs["valid"],
                    "config": TrainingSettings.model_validate(cfg).model_dump(mode="json"),  # the run form's
                    "run_key": "lost-host",
                    "storage": f"{s3_bucket}/runs",
                    "checkpointing": {"checkpoint_every": 1},
                    "execution": {"cpu_threads": THREADS},
                },
            )
        wait_for_marker(markers, "batch-9", None, timeout=300)
        _kill_host(host_a)  # the host is gone: worker, flow process and session worker at once
        host_a.wait(30)
        lost_at = time.monotonic()
        host_b = _worker(fleet_server, "host-b", tmp_path / "b.log", {})
        state = _state(fleet_server, run.id)
        assert state is not None and state.is_running(), state
        while time.monotonic() - lost_at < CRASH_BOUND_S:
            state = _state(fleet_server, run.id)
            if state is not None and state.is_crashed():
                break
            time.sleep(2)
        assert state is not None and state.is_crashed(), f"still {state} {time.monotonic() - lost_at:.0f} s later"
        _cli(fleet_server, "flow-run", "retry", str(run.id))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            state = _state(fleet_server, run.id)
            if state is not None and state.is_final():
                break
            time.sleep(2)
        assert state is not None and state.is_completed(), (state, (tmp_path / "b.log").read_text()[-4000:])
    finally:
        for worker in (host_a, host_b):
            if worker is not None and worker.poll() is None:
                _kill_host(worker)
                worker.wait(30)
    import fsspec

    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.invalidate_cache()
    fs.get(f"{s3_bucket}/runs/lost-host/export/", str(tmp_path / "export"), recursive=True)
    reference = reference_export("tiny:span", inputs, cfg, tmp_path / "reference")
    assert_same_export(str(tmp_path / "export"), reference)


def test_a_sweep_of_four_keys_trains_two_at_once_over_both_workers(
    fleet_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    """The deployed sweep (``prefect deployment run``) on two training workers: 4 runs, 2 at a time, both hosts."""
    inputs = make_inputs(tmp_path / "data")
    params = {
        "base": {
            "model": "tiny:span",
            "train_data": inputs["train"],
            "valid_data": inputs["valid"],
            "config": training_config(metric_for_best="eval_loss", num_epochs=3),
            "storage": f"{s3_bucket}/runs",
            "execution": {"cpu_threads": THREADS},
        },
        "points": [{"seed": seed} for seed in (1, 2, 3, 4)],
        "sweep_key": "fleet4",
        "max_parallel": 2,
        "poll_seconds": 1.0,
    }
    logs = {name: tmp_path / f"{name}.log" for name in ("host-a", "host-b", "sweeper")}
    workers = [_worker(fleet_server, name, logs[name], {}, queue="default") for name in ("host-a", "host-b")]
    workers.append(_worker(fleet_server, "sweeper", logs["sweeper"], {}, queue="sweeps"))
    try:
        out = _cli(fleet_server, "deployment", "run", "gliner2-sweep/sweep", "--params", json.dumps(params))
        sweep_id = UUID(re.search(r"UUID: ([0-9a-f-]{36})", out).group(1))  # type: ignore[union-attr]
        state = _wait_final(fleet_server, sweep_id, timeout=900)
        assert state is not None and state.is_completed(), (state, logs["sweeper"].read_text()[-4000:])
    finally:
        for worker in workers:
            _kill_host(worker)
            worker.wait(30)
    runs = _sweep_runs(fleet_server, "fleet4")
    keys = sorted(run.parameters["run_key"] for run in runs)
    assert len(keys) == 4 == len(set(keys)), f"one flow run per point, no duplicates: {keys}"
    assert all(run.state.is_completed() and run.run_count == 1 for run in runs), [(r.name, r.state) for r in runs]
    submitted = {name: _submitted(logs[name]) for name in ("host-a", "host-b")}
    assert all(submitted.values()), f"both workers trained: {submitted}"
    assert sorted(submitted["host-a"] + submitted["host-b"]) == sorted(str(run.id) for run in runs), submitted
    assert _most_at_once(runs) == 2, [(r.start_time, r.end_time) for r in runs]  # max_parallel=2, two workers

    import fsspec

    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.invalidate_cache()
    assert all(fs.exists(f"{s3_bucket}/runs/{key}/export/export.json") for key in keys)
    rows = _leaderboard(fleet_server, "gliner2-sweep-fleet4-leaderboard")
    assert [row["run_key"] for row in rows] != [] and sorted(row["run_key"] for row in rows) == keys
    metrics = [row["best_metric"] for row in rows]
    assert len(set(metrics) - {None}) == 4 and metrics == sorted(metrics), metrics  # eval_loss: lower is better
    by_key = {run.parameters["run_key"]: run for run in runs}
    for row in rows:
        assert row["flow_run"].startswith("http") and str(by_key[row["run_key"]].id) in row["flow_run"], row
        assert row["export"] == f"{s3_bucket}/runs/{row['run_key']}/export", row


def _wait_final(api: str, flow_run_id: UUID, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        state = _state(api, flow_run_id)
        if (state is not None and state.is_final()) or time.monotonic() > deadline:
            return state
        time.sleep(2)


def _sweep_runs(api: str, sweep_key: str) -> list[Any]:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with SyncPrefectClient(api) as client:
        return list(
            client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"sweep:{sweep_key}"])))
        )


def _submitted(log: Path) -> list[str]:
    """Flow run ids a worker submitted, from its own log ("Worker '<name>' submitting flow run '<id>'")."""
    return re.findall(r"submitting flow run '([0-9a-f-]{36})'", log.read_text())


def _most_at_once(runs: list[Any]) -> int:
    """Most flow runs in Running at one moment, from the server's start and end times of each run."""
    edges = sorted([(run.start_time, 1) for run in runs] + [(run.end_time, -1) for run in runs])
    most = current = 0
    for _, step in edges:  # at equal times an end (-1) sorts before a start: touching runs do not overlap
        current += step
        most = max(most, current)
    return most


def _leaderboard(api: str, key: str) -> list[dict[str, Any]]:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with SyncPrefectClient(api) as client:
        [artifact] = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return list(json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data)
