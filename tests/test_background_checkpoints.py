"""Background checkpoint writes: training goes on while a snapshot is written, the cursor moves only once it is
durable, one snapshot at most, failures surface, and every result is bit-identical to synchronous checkpoints."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.runtime.errors import StorageFullError, WorkerError
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.protocol import Advance, Checkpoint, CommitCheckpoint, Export, Status
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, layout
from prefect_gliner2.session_core.checkpoint import checkpoint_exists

from support.config import training_config
from support.flow import (
    THREADS,
    assert_same_export,
    flow_child,
    installed_faults,
    make_space,
    merge_params,
    reference_export,
    run_flow,
    space_params,
    wait_for_marker,
    with_threads,
)
from support.processes import kill9, pid_gone

# 12 records, batch 2, accumulation 2, 2 epochs: 12 batches, checkpoints (every 2 updates) after 3, 5, 7, 11
NAMES = ["step-000002-batch-000003", "step-000003-batch-000005", "step-000004-batch-000007", "step-000006-batch-000011"]


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    space = make_space(tmp_path_factory.mktemp("background"))
    plan = ManagedTrainingPlan(space["inputs"]["train"], TrainingConfig.from_dict(training_config()), "span")
    run_dir = RunDirectory(str(space["root"] / "worker-runs"), "w")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(space["inputs"]["valid"]))
    space["manifest"] = run_dir.manifest_uri
    return space


def _worker(space: dict[str, Any], plan: FaultPlan | None = None) -> SessionWorker:
    return SessionWorker(WorkerSpec(space["span"], space["manifest"], THREADS, faults=plan))


def _files(uri: str) -> dict[str, Any]:
    """A checkpoint's index (every file's sha256, refs, meta) and its managed state without the wall-clock time."""
    index = json.loads((Path(uri) / layout.CHECKPOINT_INDEX_FILE).read_text())
    managed = json.loads((Path(uri) / layout.MANAGED_STATE_FILE).read_text())
    del index["files"][layout.MANAGED_STATE_FILE], managed["elapsed"]
    return {"files": index["files"], "refs": index["refs"], "meta": index["meta"], "managed": managed}


def test_worker_trains_during_the_write_and_holds_one_snapshot(space: dict[str, Any], tmp_path: Path) -> None:
    """Training goes on while checkpoint 3 is written; checkpoint 5 first waits for that write; both checkpoints
    are byte-for-byte the synchronous ones, and the export equals an uninterrupted direct run."""
    markers = tmp_path / "markers"
    markers.mkdir()
    uris = {i: str(tmp_path / "bg" / NAMES[k]) for k, i in enumerate((3, 5))}
    # the write waits 8 s at its commit: the checks below run inside that window even on a busy host (4 s before)
    worker = _worker(space, FaultPlan((Fault.pause("checkpoint-write", 3, 8.0),), markers=str(markers)))
    try:
        pending = worker.call(Checkpoint(index=3, uri=uris[3], background=True))  # trains 0..3 itself
        assert pending.pending and not pending.committed and pending.cursor == 4
        trained = worker.call(Advance(first=4, through=5))  # while the write of checkpoint 3 is paused
        assert trained.cursor == 6 and not checkpoint_exists(uris[3])  # trained before the write ended
        wait_for_marker(markers, "checkpoint-write-3", timeout=60)  # the writer reaches its (paused) commit
        assert not checkpoint_exists(uris[3]) and worker.call(Status()).pending_checkpoint == uris[3]
        second = worker.call(Checkpoint(index=5, uri=uris[5], background=True))
        assert checkpoint_exists(uris[3]), "a second snapshot was taken before the first write ended"
        assert second.pending and worker.call(Status()).pending_checkpoint in (uris[5], None)
        first = worker.call(CommitCheckpoint(index=3, uri=uris[3]))  # already written: reported, not rewritten
        assert first.committed and first.existing is False and first.cursor == 4 and first.index_sha256
        last = worker.call(CommitCheckpoint(index=5, uri=uris[5]))
        assert last.committed and last.cursor == 6 and last.best_step == 3
        assert worker.call(Status()).pending_checkpoint is None
        worker.call(Export(uri=str(tmp_path / "export"), which="best"))
    finally:
        worker.close()
    synchronous = _worker(space)
    try:
        for index, uri in uris.items():
            twin = str(tmp_path / "sync" / Path(uri).name)
            assert synchronous.call(Checkpoint(index=index, uri=twin)).committed
            assert _files(uri) == _files(twin), f"background checkpoint {index} differs from the synchronous one"
    finally:
        synchronous.close()
    direct = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "direct")
    assert_same_export(str(tmp_path / "export"), direct)


def test_a_failed_background_write_is_raised_and_never_committed(space: dict[str, Any], tmp_path: Path) -> None:
    """The write fails in the background: the next operation (whatever it is) raises it, nothing is committed; a
    fresh worker asked to commit that checkpoint writes it itself."""
    markers = tmp_path / "markers"
    markers.mkdir()
    uri = str(tmp_path / NAMES[0])
    plan = FaultPlan((Fault.fail("checkpoint-write", 3, once=str(tmp_path / "failed")),), markers=str(markers))
    worker = _worker(space, plan)
    try:
        assert worker.call(Checkpoint(index=3, uri=uri, background=True)).pending
        wait_for_marker(markers, "checkpoint-write-3", timeout=60)
        deadline = time.monotonic() + 30
        with pytest.raises(WorkerError, match="injected transient failure at checkpoint-write 3"):
            while time.monotonic() < deadline:
                worker.call(Status())  # answers while the write runs, raises its failure once it has failed
                time.sleep(0.05)
        assert not checkpoint_exists(uri)
        again = worker.call(CommitCheckpoint(index=3, uri=uri))  # a fresh worker: written synchronously now
        assert again.committed and again.cursor == 4 and checkpoint_exists(uri) and worker.starts == 2
    finally:
        worker.close()


def _flow(space: dict[str, Any], run_key: str, **extra: Any) -> dict[str, Any]:
    checkpointing = {"keep_checkpoints": None, "background_checkpoints": True}
    return merge_params(space_params(space, run_key, checkpointing=checkpointing), extra)


@pytest.mark.usefixtures("prefect_server")
def test_background_flow_is_bit_identical_and_commits_every_checkpoint(space: dict[str, Any]) -> None:
    """Pipelined and in the background: the same export as a direct run, every checkpoint committed in order."""
    from prefect_gliner2.tasks import checkpoints as checkpoint_tasks

    events: list[str] = []
    original = checkpoint_tasks.emit_event
    checkpoint_tasks.emit_event = lambda **kw: events.append(kw["payload"]["name"]) or original(**kw)  # type: ignore[assignment]
    try:
        summary = run_flow(**_flow(space, "bg-pipelined", execution={"pipeline_depth": 2}))
    finally:
        checkpoint_tasks.emit_event = original  # type: ignore[assignment]
    direct = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "direct")
    assert_same_export(summary["export"], direct)
    assert events == NAMES and summary["worker_starts"] == 1
    run = space["root"] / "runs" / "bg-pipelined"
    cursor = json.loads((run / "cursor.json").read_text())
    assert (cursor["checkpoint"], cursor["cursor"], cursor["finished"]) == (NAMES[-1], 12, True)


@pytest.mark.usefixtures("prefect_server")
def test_a_slow_commit_still_commits_the_durable_checkpoint_before_a_later_write_fails(
    space: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow's commits lag (each waits 1.5 s, as on a busy machine) while the worker runs ahead through operations
    sent ahead: the next background checkpoint is not sent before the earlier one is committed, so the failure of
    its write (raised by the operation after it, after which the worker exits) cannot leave the durable checkpoint
    before it uncommitted."""
    from prefect_gliner2.flows import driver

    real_commit = driver.commit_checkpoint

    def slow_commit(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(driver, "commit_checkpoint", slow_commit)
    plan = FaultPlan((Fault.os_error("checkpoint-write", 7, errno.ENOSPC, once=str(space["root"] / "enospc-slow")),))
    with installed_faults(plan), pytest.raises(StorageFullError):
        run_flow(**_flow(space, "bg-full-slow-commit", execution={"pipeline_depth": 4}))
    run = space["root"] / "runs" / "bg-full-slow-commit"
    assert json.loads((run / "cursor.json").read_text())["checkpoint"] == NAMES[1]
    assert not checkpoint_exists(str(run / "checkpoints" / NAMES[2]))


@pytest.mark.usefixtures("prefect_server")
def test_full_storage_in_a_background_write_fails_the_run_and_keeps_the_cursor(space: dict[str, Any]) -> None:
    plan = FaultPlan((Fault.os_error("checkpoint-write", 7, errno.ENOSPC, once=str(space["root"] / "enospc")),))
    with installed_faults(plan), pytest.raises(StorageFullError):
        run_flow(**_flow(space, "bg-full"))
    run = space["root"] / "runs" / "bg-full"
    assert json.loads((run / "cursor.json").read_text())["checkpoint"] == NAMES[1]
    assert not checkpoint_exists(str(run / "checkpoints" / NAMES[2]))


@pytest.mark.usefixtures("prefect_server")
def test_early_stopping_commits_the_background_checkpoint_then_the_final_one(space: dict[str, Any]) -> None:
    """Checkpoint 1 is written in the background while batches 2-3 train and validation stops the run at batch 3
    (operations sent ahead): it is committed, then the final checkpoint; the export equals a direct run's."""
    cfg = training_config(
        eval_strategy="steps",
        eval_steps=1,
        early_stopping=True,
        early_stopping_patience=1,
        early_stopping_threshold=1e9,
    )
    params = _flow(
        space, "bg-early", execution={"pipeline_depth": 2}, config=cfg, checkpointing={"checkpoint_every": 1}
    )
    summary = run_flow(**params)
    assert summary["stopped_early"] and summary["total_steps"] == 2
    run = space["root"] / "runs" / "bg-early"
    cursor = json.loads((run / "cursor.json").read_text())
    assert cursor["finished"] and cursor["checkpoint"] == "step-000002-batch-000003"
    assert checkpoint_exists(str(run / "checkpoints" / "step-000001-batch-000001"))
    reference = reference_export(space["span"], space["inputs"], cfg, space["root"] / "direct-early")
    assert_same_export(summary["export"], reference)


def test_kill_during_a_background_write_resumes_exactly(
    space: dict[str, Any], prefect_server: str, tmp_path: Path
) -> None:
    """The write of checkpoint 7 pauses; training goes on to batch 8; the cursor still names checkpoint 5. SIGKILL
    the flow there (its worker dies with it); a new flow run resumes from checkpoint 5 and ends bit-identical."""
    markers = tmp_path / "markers"
    markers.mkdir()
    # nothing sent ahead: the commit of checkpoint 5 is not queued behind operations already with the worker
    params = _flow(space, "bg-killed", execution={"batches_per_task": 1, "pipeline_depth": 0})
    plan = FaultPlan((Fault.pause("checkpoint-write", 7, 120.0),), markers=str(markers))
    process = flow_child(params, plan, prefect_server)
    try:
        writer = wait_for_marker(markers, "checkpoint-write-7", process)
        assert wait_for_marker(markers, "batch-8", process) == writer  # the worker trains during the write
        run = space["root"] / "runs" / "bg-killed"
        assert json.loads((run / "cursor.json").read_text())["checkpoint"] == NAMES[1]
        assert not checkpoint_exists(str(run / "checkpoints" / NAMES[2]))
    finally:
        kill9(process)
    assert pid_gone(writer)
    resumed = run_flow(**params)
    assert resumed["worker_starts"] == 1
    direct = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "direct")
    assert_same_export(resumed["export"], direct)


def test_snapshot_copies_are_detached_from_the_live_tensors(space: dict[str, Any]) -> None:
    """`state_payload(snapshot=True)` writes what the state was when it was taken, whatever training does next."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training import TrainingSession

    torch.set_num_threads(THREADS)
    plan = ManagedTrainingPlan(space["inputs"]["train"], TrainingConfig.from_dict(training_config()), "span")
    session = TrainingSession(load_model(space["span"]), plan.config, max_steps=plan.max_steps)
    try:
        session.forward_backward(plan.batch(0))
        session.forward_backward(plan.batch(1))
        session.optim_step()
        session.forward_backward(plan.batch(2))  # a pending gradient, too
        live, _ = session.state_payload()
        before = {name: _bytes(payload) for name, payload in live.items()}
        snapshot, _ = session.state_payload(snapshot=True)
        session.forward_backward(plan.batch(3))  # moves gradients and RNG streams, then weights and moments
        session.optim_step()
        assert {name: _bytes(payload) for name, payload in snapshot.items()} == before
        changed, _ = session.state_payload()
        for name in (layout.WEIGHTS_FILE, layout.OPTIMIZER_TENSORS_FILE, layout.RNG_FILE):
            assert _bytes(changed[name]) != before[name], name
    finally:
        session.close()


def _bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    import io

    buffer = io.BytesIO()
    payload(buffer)
    return buffer.getvalue()


def test_a_new_best_while_a_snapshot_waits_keeps_each_checkpoint_its_own_best(
    space: dict[str, Any], tmp_path: Path
) -> None:
    """A prepared checkpoint names the best weights of its moment: a new best (a new dict, the old one never
    mutated) found before the write gets its own blob, and the pending write still stores the old one."""
    import safetensors.torch
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.records import load_records
    from prefect_gliner2.training import ManagedTraining, TrainingSession

    torch.set_num_threads(THREADS)
    cfg = training_config(eval_strategy="steps", eval_steps=1, eval_extraction=False, metric_for_best="eval_loss")
    plan = ManagedTrainingPlan(space["inputs"]["train"], TrainingConfig.from_dict(cfg), "span")
    evals = load_records(space["inputs"]["valid"], what="validation").examples()
    session = TrainingSession(load_model(space["span"]), plan.config, max_steps=plan.max_steps)
    run = ManagedTraining(session, plan, eval_examples=evals)
    try:
        run.run(until=2)  # one update, validated: the first best
        assert run.best_step == 1 and run.best_state is not None
        prepared = run.prepare_checkpoint(str(tmp_path / "a"))
        old = run.best_state
        kept = {name: tensor.clone() for name, tensor in old.items()}
        run.run(until=plan.batch_count)
        assert run.best_step is not None and run.best_step > 1 and run.best_state is not old, "no new best: vacuous"
        assert all(torch.equal(old[name], kept[name]) for name in kept), "the old best was mutated in place"
        run.write_prepared(prepared)
        run.save_state(str(tmp_path / "b"))
        blobs = {}
        for name in ("a", "b"):
            index = json.loads((tmp_path / name / layout.CHECKPOINT_INDEX_FILE).read_text())
            blobs[name] = safetensors.torch.load_file(
                str(tmp_path / name / index["refs"][layout.BEST_WEIGHTS_FILE]["path"])
            )
        assert all(torch.equal(blobs["a"][name], kept[name]) for name in kept)
        assert all(torch.equal(blobs["b"][name], run.best_state[name]) for name in kept)
        assert any(not torch.equal(blobs["a"][name], blobs["b"][name]) for name in kept)
    finally:
        run.close()


@pytest.mark.usefixtures("prefect_server")
def test_a_flow_retry_lets_the_write_in_flight_finish_before_cleaning_debris(
    space: dict[str, Any], tmp_path: Path
) -> None:
    """The flow fails after batch 8 while checkpoint 7 is still being written; its retry reuses the live worker and
    waits for that write instead of deleting its staged files as debris: no worker restart, the same export."""
    from prefect_gliner2.flows.train import train_flow

    plan = FaultPlan(
        (Fault.pause("checkpoint-write", 7, 6.0), Fault.fail("unit", 8, once=str(tmp_path / "raised"))),
        markers=str(tmp_path),
    )
    # one task per batch, nothing sent ahead: the fault fails the unit that ends at batch 8
    params = with_threads(_flow(space, "bg-flow-retry", execution={"batches_per_task": 1, "pipeline_depth": 0}))
    with installed_faults(plan):
        summary = train_flow.with_options(retries=1)(**params)
    assert (tmp_path / "raised").exists() and (tmp_path / "checkpoint-write-7").exists()
    assert summary["worker_starts"] == 1
    direct = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "direct")
    assert_same_export(summary["export"], direct)
