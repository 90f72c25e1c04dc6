"""A fleet on loopback (slow; ``make test-fleet``): a Prefect server on PostgreSQL, process workers, S3 storage.

Lost-host recovery end to end: a worker host running a training flow dies (worker, flow process and session worker
killed together), the shipped automation (deployments/automations.yaml) marks the silent run CRASHED within a
bounded time, and ``prefect flow-run retry`` runs it on a second worker, which takes the lease over and finishes
with the bits of an uninterrupted run.
"""

from __future__ import annotations

import os
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

from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.config import training_config
from support.flow import FAULT_SITE, ROOT, THREADS, assert_same_export, make_inputs, reference_export, wait_for_marker
from support.services import _stop, _wait_http, free_port

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
        "PREFECT_API_DATABASE_CONNECTION_URL": postgres_url,
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


def _worker(api: str, name: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process worker in its own process group: killing the group is losing the whole host."""
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
    with SyncPrefectClient(fleet_server) as client:
        deployment = client.read_deployment_by_name("gliner2-train/train")
        run = client.create_flow_run_from_deployment(
            deployment.id,
            parameters={
                "model": "tiny:span",
                "train_data": inputs["train"],
                "valid_data": inputs["valid"],
                "config": cfg,
                "run_key": "lost-host",
                "storage": f"{s3_bucket}/runs",
                "checkpoint_every": 1,
                "cpu_threads": THREADS,
            },
        )
    host_b: subprocess.Popen[bytes] | None = None
    try:
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
