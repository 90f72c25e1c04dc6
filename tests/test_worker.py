"""The session worker process and its client: order, idempotence, parent death, kill -> WorkerDied -> exact restart."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prefect_gliner2.runtime.errors import StorageFullError, WorkerDied, WorkerError, is_transient
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.protocol import Advance, Checkpoint, Export, Status, Validate
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.errors import CheckpointError, ConfigError

from support.config import training_config
from support.flow import (
    ROOT,
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
    """A span run directory with a manifest (12 records, batch 2, accumulation 2, 2 epochs: 12 batches)."""
    root = tmp_path_factory.mktemp("worker")
    inputs = make_inputs(root / "data")
    cfg = training_config()
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(cfg), architecture="span")
    run_dir = RunDirectory(str(root / "runs"), "w")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(inputs["valid"]))
    return {"root": str(root), "manifest": run_dir.manifest_uri, "model": tiny_model_dir(root, "span"), **inputs}


def _worker(run: dict[str, str], locator=None, faults: FaultPlan | None = None) -> SessionWorker:  # type: ignore[no-untyped-def]
    return SessionWorker(WorkerSpec(run["model"], run["manifest"], THREADS, faults=faults), restore_locator=locator)


def test_operations_run_in_order_and_are_idempotent(run: dict[str, str]) -> None:
    worker = _worker(run)
    try:
        first = worker.call(Advance(first=0, through=1))
        assert (first.cursor, first.step, first.replayed) == (2, 1, 0)
        tickets = [worker.submit(Advance(first=i, through=i)) for i in range(2, 6)]
        assert worker.submit(Advance(first=5, through=5)) is tickets[-1]  # joins the outstanding call
        assert [t.result(60).cursor for t in tickets] == [3, 4, 5, 6]
        again = worker.call(Advance(first=0, through=1))  # already past: the recorded history, no work
        assert again.cursor == 6 and again.updates == first.updates and len(first.updates) == 1
        jump = worker.call(Validate(index=5))  # validation after batch 5 (epoch end) runs now, exactly once
        assert jump.metrics["batch"] == 5 and jump.best_step == 3
        assert worker.call(Validate(index=5)).metrics == jump.metrics
        status = worker.call(Status())
        assert status.cpu_threads == THREADS and status.cursor == 6 and not status.validation_due
    finally:
        worker.close()
    assert worker.pid is None or pid_gone(worker.pid or 0)


def test_worker_kill_restarts_from_checkpoint_bitwise(
    run: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="prefect_gliner2.runtime.worker")
    checkpoint = str(tmp_path / "step-000002-batch-000003")
    markers = tmp_path / "markers"
    markers.mkdir()
    # the first worker waits at batch 9 until the test kills it (once: the restarted worker trains on at once); a
    # short pause let a test process that woke late find batch 9 already done and nothing in flight to kill
    plan = FaultPlan(faults=(Fault.pause("batch", 9, 120, once=str(markers / "paused")),), markers=str(markers))
    restore: list[str | None] = [None]
    worker = _worker(run, locator=lambda: restore[0], faults=plan)
    try:
        worker.call(Advance(first=0, through=2))
        # a worker spawned for its run has it once torch is imported; nothing to read ahead on a fresh start
        assert [phase for phase, _ in worker.call(Status()).start] == ["run", "imported", "ready"]
        assert worker.call(Checkpoint(index=3, uri=checkpoint)).committed  # advances to 3 itself
        restore[0] = checkpoint
        worker.call(Advance(first=4, through=8))
        first_pid, first_incarnation = worker.pid, worker.incarnation
        in_flight = worker.submit(Advance(first=9, through=9))
        assert wait_for_marker(markers, "batch-9") == first_pid
        worker.kill()  # SIGKILL mid-operation
        with pytest.raises(WorkerDied) as died:
            in_flight.result(60)
        assert is_transient(died.value) and "newest committed checkpoint" in str(died.value)
        assert pid_gone(first_pid or 0)
        resumed = worker.call(Advance(first=9, through=9))  # fresh worker from the checkpoint, replays 4..8
        assert resumed.replayed == 5 and resumed.cursor == 10
        # the restarted worker began reading its checkpoint before it imported transformers and gliner2
        start = worker.call(Status()).start
        assert [phase for phase, _ in start] == ["run", "prefetch", "imported", "ready"]
        assert [seconds for _, seconds in start] == sorted(seconds for _, seconds in start)
        ready = [r.getMessage() for r in caplog.records if "ready (pid" in r.getMessage()]  # both starts, logged
        assert len(ready) == 2 and ", prefetch " in ready[1] and ", prefetch " not in ready[0], ready
        assert worker.incarnation != first_incarnation and worker.restored_from == checkpoint
        assert worker.incarnation and worker.incarnation.startswith("step-000002-batch-000003@")
        worker.call(Export(uri=str(tmp_path / "export"), which="best"))
    finally:
        worker.close()
    direct = reference_export(run["model"], run, training_config(), tmp_path / "direct")
    assert_same_export(str(tmp_path / "export"), direct)
    # the last checkpoint (batch 3) holds other weights than the export: its file is not shared
    assert _inode(f"{checkpoint}/weights.safetensors") != _inode(tmp_path / "export" / "model.safetensors")


def _inode(path: str | Path) -> int:
    return os.stat(path).st_ino


def test_an_export_at_the_last_checkpoints_step_shares_its_weights_file(run: dict[str, str], tmp_path: Path) -> None:
    """The run's last checkpoint and a final export of the same weights: one file on disk (linked after the bytes
    were compared; that the directory is the one a full write makes is tests/test_native_save.py's), the export's
    digest that of its file, the checkpoint still verifying."""
    import json

    from prefect_gliner2.session_core.checkpoint import read_checkpoint
    from prefect_gliner2.training.state import file_tensors_digest

    plan = ManagedTrainingPlan(run["train"], TrainingConfig.from_dict(training_config()), architecture="span")
    checkpoint = str(tmp_path / "last")
    worker = _worker(run)
    try:
        assert worker.call(Checkpoint(index=plan.batch_count - 1, uri=checkpoint)).committed  # trains to the end
        worker.call(Export(uri=str(tmp_path / "linked"), which="final"))
    finally:
        worker.close()
    exported = tmp_path / "linked" / "model.safetensors"
    assert _inode(f"{checkpoint}/weights.safetensors") == _inode(exported)
    info = json.loads((tmp_path / "linked" / "export.json").read_text(encoding="utf-8"))
    assert info["label"] == "final" and info["weights_sha256"] == file_tensors_digest(str(exported))
    read_checkpoint(checkpoint)


def test_deterministic_and_transient_remote_errors(run: dict[str, str], tmp_path: Path) -> None:
    broken = _worker(run, locator=lambda: str(tmp_path / "no-such-checkpoint"))
    try:
        with pytest.raises(CheckpointError, match="no committed checkpoint") as refused:
            broken.call(Status())
        assert not is_transient(refused.value) and type(refused.value) is CheckpointError
        assert "open_checkpoint" in refused.value.remote_traceback  # type: ignore[attr-defined]
        assert any("remote traceback" in note for note in refused.value.__notes__)
    finally:
        broken.close()
    worker = _worker(run, faults=FaultPlan(faults=(Fault.fail("batch", 1, once=str(tmp_path / "raised-once")),)))
    try:
        with pytest.raises(WorkerError, match="injected transient failure") as failed:
            worker.call(Advance(first=0, through=2))
        assert is_transient(failed.value) and "RuntimeError" in str(failed.value)
        assert failed.value.remote_type == "RuntimeError" and "_fire" in failed.value.remote_traceback
        assert worker.call(Advance(first=0, through=2)).cursor == 3  # a fresh worker; the fault fired once
        assert worker.starts == 2
    finally:
        worker.close()


def test_full_storage_in_the_worker_is_permanent(run: dict[str, str], tmp_path: Path) -> None:
    """ENOSPC while the worker writes a checkpoint: StorageFullError (never retried) with its errno, no partial
    checkpoint left that looks complete, and once space is back a fresh worker writes the same checkpoint. A worker
    that raised exits; an operation already sent behind the failing one fails with the same error, so a full disk
    stays a StorageFullError (never retried) instead of becoming a dead worker that a retry restarts."""
    full_once = Fault.os_error("checkpoint-write", 3, errno.ENOSPC, once=str(tmp_path / "full-once"))
    checkpoint = str(tmp_path / "ckpt-3")
    worker = _worker(run, faults=FaultPlan(faults=(full_once,)))
    try:
        worker.call(Advance(first=0, through=2))
        failing, behind = Checkpoint(index=3, uri=checkpoint), Advance(first=3, through=3)
        tickets = [worker.submit(failing), worker.submit(behind)]  # the second sent before the child fails
        with pytest.raises(StorageFullError, match="ENOSPC.*free space.*run the same run key again") as full:
            tickets[0].result(120)
        with pytest.raises(StorageFullError, match="ENOSPC"):
            tickets[1].result(120)
        assert worker.starts == 1
        for request in (failing, behind):
            worker.release(request)  # consumed here: the next call of the same checkpoint is a new operation
        assert not is_transient(full.value) and isinstance(full.value, OSError)
        assert full.value.errno == errno.ENOSPC and "injected at checkpoint-write 3" in full.value.message
        assert "before_commit" in full.value.remote_traceback  # type: ignore[attr-defined]
        assert not Path(checkpoint).exists() and not list(tmp_path.glob(".ckpt-3.partial-*"))
        assert worker.call(Checkpoint(index=3, uri=checkpoint)).committed
        assert worker.starts == 2
    finally:
        worker.close()


def test_answers_sent_ahead_survive_the_exit_of_a_worker_that_raised(run: dict[str, str], tmp_path: Path) -> None:
    """Pipelined: the worker answers one operation, raises a full storage on the next and exits. Joined only after
    the exit, the first still gets its answer and the second its error, with no fresh worker started (a restart
    would have lost the error: the fault fires once)."""
    full_once = Fault.os_error("batch", 5, errno.ENOSPC, once=str(tmp_path / "full-once"))
    worker = _worker(run, faults=FaultPlan(faults=(full_once,)))
    try:
        first, second = Advance(first=0, through=3), Advance(first=4, through=7)
        tickets = [worker.submit(first), worker.submit(second)]
        pid = worker.pid
        assert pid is not None and pid_gone(pid, timeout=120)  # exited after raising
        deadline = time.monotonic() + 30  # the parent's reader may take the last answers a moment after the exit
        while not all(ticket.done() for ticket in tickets) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.answered(first) and worker.answered(second) and tickets[1].done()
        assert worker.call(first).cursor == 4
        with pytest.raises(StorageFullError, match="ENOSPC"):
            worker.call(second)
        assert worker.starts == 1
        assert worker.call(Advance(first=4, through=7)).cursor == 8 and worker.starts == 2  # then a fresh one
    finally:
        worker.close()


def test_transient_classification_follows_the_cause_chain() -> None:
    assert is_transient(OSError(errno.EIO, "io"))
    assert is_transient(ConnectionResetError())
    for code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS):
        try:
            try:
                raise OSError(code, "write failed")
            except OSError as inner:
                raise RuntimeError("while saving") from inner
        except RuntimeError as outer:
            assert not is_transient(outer), code


_PARENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
    worker = SessionWorker(WorkerSpec({model!r}, {manifest!r}, 1))
    from prefect_gliner2.runtime.protocol import Status
    worker.call(Status())  # fully up: restored and serving
    from prefect_gliner2.runtime.forkserver import server_pids
    print(" ".join(str(pid) for pid in [worker.pid, *server_pids()]), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
""")


@pytest.mark.parametrize("how", ["kill-9", "plain-exit"])
def test_worker_exits_when_its_parent_dies(run: dict[str, str], how: str) -> None:
    script = _PARENT.format(root=str(ROOT), model=run["model"], manifest=run["manifest"])
    parent = subprocess.Popen(
        [sys.executable, "-c", script, "wait" if how == "kill-9" else "exit"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )
    assert parent.stdout is not None
    child, *servers = (int(pid) for pid in parent.stdout.readline().split())
    if how == "kill-9":
        parent.kill()  # SIGKILL: no atexit, no close(); PR_SET_PDEATHSIG takes the worker down
    parent.wait(30)
    assert pid_gone(child, timeout=15), f"worker {child} survived its parent ({how})"
    assert all(pid_gone(server, timeout=15) for server in servers), f"forkserver {servers} survived ({how})"


def test_lora_run_seeded_from_a_full_model_restores_over_the_same_base(tmp_path: Path) -> None:
    """New adapters over a full model's weights: a restart must rebuild that base, or the base hash check refuses."""
    from prefect_gliner2.training.tiny import save_tiny_model

    inputs = make_inputs(tmp_path / "data")
    cfg = training_config(use_lora=True, lora_r=4, lora_alpha=8.0)
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(cfg), architecture="span")
    run_dir = RunDirectory(str(tmp_path / "runs"), "lora-init")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(inputs["valid"]))
    full = str(save_tiny_model(tmp_path / "full-model", "span", seed=7))  # different weights from the base
    spec = WorkerSpec(tiny_model_dir(tmp_path, "span"), run_dir.manifest_uri, THREADS, init_weights=full)
    checkpoint = str(tmp_path / "step-000002-batch-000003")
    restore: list[str | None] = [None]
    worker = SessionWorker(spec, restore_locator=lambda: restore[0])
    try:
        worker.call(Checkpoint(index=3, uri=checkpoint))
        restore[0] = checkpoint
        worker.call(Advance(first=4, through=plan.batch_count - 1))
        worker.call(Export(uri=str(tmp_path / "uninterrupted"), which="final"))
        worker.kill()
        with pytest.raises(WorkerDied):
            worker.call(Status())
        resumed = worker.call(Advance(first=4, through=plan.batch_count - 1))  # a fresh worker restores
        assert resumed.cursor == plan.batch_count and worker.restored_from == checkpoint
        worker.call(Export(uri=str(tmp_path / "resumed"), which="final"))
    finally:
        worker.close()
    assert_same_export(str(tmp_path / "resumed"), str(tmp_path / "uninterrupted"))


def test_a_spare_worker_is_adopted_by_the_next_start_and_trains_the_same_bits(
    run: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prestart_worker() starts a worker process before its run is known; the next start adopts that very process
    (same pid), which trains exactly what a freshly spawned one does. A spare nobody adopts is killed, and one whose
    environment no longer matches what a worker would get is not adopted."""
    from prefect_gliner2.runtime import spare

    assert spare.prestart_worker() and not spare.prestart_worker()  # one spare at most
    spare_pid = spare.spare_pid()
    worker = _worker(run)
    try:
        assert spare_pid and worker.start() and worker.pid == spare_pid and spare.spare_pid() is None
        worker.call(Export(uri=str(tmp_path / "adopted"), which="final"))
    finally:
        worker.close()
    fresh = _worker(run)
    try:
        fresh.call(Export(uri=str(tmp_path / "spawned"), which="final"))
        assert fresh.pid != spare_pid
    finally:
        fresh.close()
    assert_same_export(str(tmp_path / "adopted"), str(tmp_path / "spawned"))

    spare.prestart_worker()
    unadopted = spare.spare_pid() or 0
    spare.discard_spare()
    assert spare.spare_pid() is None and pid_gone(unadopted)

    spare.prestart_worker()
    stale = spare.spare_pid() or 0
    monkeypatch.setenv("PREFECT_GLINER2_WORKER_MEMORY", "release")  # a worker started now would get glibc's defaults
    assert spare.take_spare() is None and pid_gone(stale)

    monkeypatch.setenv(spare.ENV_SPARE_WORKER, "off")
    assert not spare.prestart_worker() and spare.spare_pid() is None
    monkeypatch.setenv(spare.ENV_SPARE_WORKER, "sometimes")
    with pytest.raises(ConfigError, match="PREFECT_GLINER2_SPARE_WORKER='sometimes' is not one of on, off"):
        spare.prestart_worker()
