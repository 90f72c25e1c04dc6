"""Session workers forked from the preloaded server (runtime.forkserver): the same bits as a spawned worker, what a
spawned child would take from this process taken at each start, a new server when the environment changes, and a
start that still happens (spawned) when the server dies before forking or cannot import."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from prefect_gliner2.runtime import forkserver
from prefect_gliner2.runtime.errors import WorkerDied, WorkerError
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.protocol import Advance, Checkpoint, Export, Status
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError, SessionCoreError

from support.config import training_config
from support.flow import (
    THREADS,
    assert_same_export,
    make_inputs,
    reference_export,
    tiny_model_dir,
    wait_for_marker,
)
from support.processes import pid_gone


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("forkserver")
    inputs = make_inputs(root / "data")
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(training_config()), architecture="span")
    run_dir = RunDirectory(str(root / "runs"), "f")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(inputs["valid"]))
    model = tiny_model_dir(root, "span")
    return {"manifest": run_dir.manifest_uri, "model": model, "batches": str(plan.batch_count), **inputs}


def _worker(run: dict[str, str]) -> SessionWorker:
    return SessionWorker(WorkerSpec(run["model"], run["manifest"], THREADS))


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def test_a_forked_worker_trains_the_bits_a_spawned_one_does(
    run: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default start forks the worker from a server that is this process's child; the worker takes this
    process's working directory and standard error at its start (not the server's), and trains exactly what a
    spawned worker trains."""
    assert forkserver.start_mode() == "forkserver"
    last = int(run["batches"]) - 1
    forked = _worker(run)
    try:
        forked.call(Status())
        monkeypatch.chdir(tmp_path)  # after the server started: the next worker must still start here
        moved = _worker(run)
        try:
            moved.call(Status())
            pid = moved.pid or 0
            server = _parent(pid)
            assert server != os.getpid() and _parent(server) == os.getpid() and server in forkserver.server_pids()
            comms = [Path(f"/proc/{p}/comm").read_text().strip() for p in (pid, server)]
            assert comms == ["gliner2-worker", "gliner2-forksrv"]  # what ps and top show
            assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
            assert os.readlink(f"/proc/{pid}/fd/2") == os.readlink("/proc/self/fd/2")
            assert (moved.pid or 0, "gliner2-session-worker") in [(p, n) for n, p in forkserver.forked_workers()]
        finally:
            moved.close()
        forked.call(Advance(first=0, through=last))
        forked.call(Export(uri=str(tmp_path / "forked"), which="final"))
    finally:
        forked.close()
    monkeypatch.setenv(forkserver.ENV_WORKER_START, "spawn")
    spawned = _worker(run)
    try:
        spawned.call(Advance(first=0, through=last))
        assert _parent(spawned.pid or 0) == os.getpid()
        spawned.call(Export(uri=str(tmp_path / "spawned"), which="final"))
    finally:
        spawned.close()
    assert_same_export(str(tmp_path / "forked"), str(tmp_path / "spawned"))
    monkeypatch.setenv(forkserver.ENV_WORKER_START, "fork")
    with pytest.raises(ConfigError, match="PREFECT_GLINER2_WORKER_START='fork' is not one of forkserver, spawn"):
        _worker(run).call(Status())


def test_a_changed_environment_gets_a_new_server_and_the_old_one_exits_after_its_last_worker(
    run: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable a library may read while importing changed: the next worker comes from a new server, started
    with it; the old server forks nothing more and exits when its last worker has (which keeps running till then).
    Prefect's own variables and pytest's current test do not count."""
    monkeypatch.setenv("GLINER2_TEST_IDENTITY", "one")
    first = _worker(run)
    try:
        first.call(Status())
        old = _parent(first.pid or 0)
        monkeypatch.setenv("PREFECT_GLINER2_TEST_UNRELATED", "x")  # Prefect's namespace: the same server
        monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # pytest's, set anew for every test
        same = _worker(run)
        try:
            same.call(Status())
            assert _parent(same.pid or 0) == old
        finally:
            same.close()
        monkeypatch.setenv("GLINER2_TEST_IDENTITY", "two")
        second = _worker(run)
        try:
            second.call(Status())
            new = _parent(second.pid or 0)
            assert new != old and forkserver.server_pids()[-1] == new
            assert first.call(Advance(first=0, through=1)).cursor == 2  # the retired server's worker runs on
            assert not pid_gone(old, timeout=0.5)
            first.close()
            assert pid_gone(old), "a retired server outlived its last worker"
        finally:
            second.close()
    finally:
        first.close()


def test_a_server_killed_before_it_forks_leaves_the_start_to_a_spawned_worker(
    run: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLINER2_TEST_IDENTITY", "killed")  # a server of its own, still importing when killed
    worker = _worker(run)
    try:
        assert worker.start()
        server = forkserver.server_pids()[-1]
        os.kill(server, 9)
        assert worker.call(Status()).cursor == 0
        assert _parent(worker.pid or 0) == os.getpid()  # spawned: the server never forked it
        worker.kill()
        with pytest.raises(WorkerDied, match="killed by SIGKILL"):
            worker.call(Status())
    finally:
        worker.close()
    assert pid_gone(server)


def test_a_server_killed_under_a_running_worker_takes_it_down_and_the_next_call_starts_anew(
    run: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL of the server while its worker trains: the worker dies with it (its parent-death signal), the calls
    on it raise WorkerDied (retryable), the log says why, and the next call gets a worker from a new server that
    restores the checkpoint and trains on to the bits of an uninterrupted in-process run."""
    monkeypatch.setenv("GLINER2_TEST_IDENTITY", "server-killed-mid-run")
    last = int(run["batches"]) - 1
    checkpoint = str(tmp_path / "step-000001-batch-000003")
    markers = tmp_path / "markers"
    markers.mkdir()
    # the first worker waits at batch 6 until its server is killed (once: the next worker trains on at once)
    faults = FaultPlan(faults=(Fault.pause("batch", 6, 120, once=str(markers / "paused")),), markers=str(markers))
    restore: list[str | None] = [None]
    spec = WorkerSpec(run["model"], run["manifest"], THREADS, faults=faults)
    worker = SessionWorker(spec, restore_locator=lambda: restore[0])
    try:
        worker.call(Checkpoint(index=3, uri=checkpoint))
        restore[0] = checkpoint
        worker.call(Advance(first=4, through=5))
        first, server = worker.pid or 0, _parent(worker.pid or 0)
        in_flight = worker.submit(Advance(first=6, through=6))
        assert wait_for_marker(markers, "batch-6") == first
        os.kill(server, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="exit code 255"):
            in_flight.result(60)
        assert pid_gone(first) and pid_gone(server)
        assert any("forkserver" in r.getMessage() and "died with it" in r.getMessage() for r in caplog.records)
        resumed = worker.call(Advance(first=4, through=last))
        assert resumed.cursor == last + 1 and worker.restored_from == checkpoint
        assert _parent(worker.pid or 0) not in (server, os.getpid())  # forked by a new server
        worker.call(Export(uri=str(tmp_path / "resumed"), which="final"))
    finally:
        worker.close()
    direct = reference_export(run["model"], run, training_config(), tmp_path / "direct")
    assert_same_export(str(tmp_path / "resumed"), direct)


def test_a_server_that_cannot_import_leaves_the_start_to_a_spawned_worker_which_reports_why(
    run: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gliner2 that fails to import: the server says it cannot fork, and the worker the start was asked for is
    spawned, which reports the import error as a worker always has (no hang, no silent fallback to nothing)."""
    planted = tmp_path / "planted" / "gliner2"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("raise ImportError('planted: this gliner2 cannot be imported')\n")
    monkeypatch.syspath_prepend(str(planted.parent))
    worker = _worker(run)
    started = time.monotonic()
    try:
        with pytest.raises((SessionCoreError, WorkerError, WorkerDied), match="planted"):
            worker.call(Status(), timeout=120)
    finally:
        worker.close()
    assert time.monotonic() - started < 120
