"""A resume's state files read in the background while the session is built (``prefetch_state``): each file read
once, in the prefetch thread, the same bits as a restore that reads them itself, damage reported by `load_state` as
before, and a prefetch never handed to another checkpoint. A restore leaves its checkpoint's own files out of the
page cache (their bytes are in the tensors now); a verification or a warm start from the same files keeps them."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import discard_prefetch, open_checkpoint, read_checkpoint, reader
from prefect_gliner2.session_core.checkpoint.format import INDEX_FILE
from prefect_gliner2.training import CheckpointDamagedError, ManagedTraining, TrainingSession
from prefect_gliner2.training.session_checkpoint import PREFETCHED_FILES, prefetch_state

from support.pagecache import cached_files, cached_pages, read_through_cache
from support.session import (
    assert_bitwise_equal,
    eval_records,
    make_config,
    make_model,
    make_plan,
    run_direct,
    snapshot,
)


@pytest.fixture(autouse=True)
def _no_prefetch_left():
    yield
    discard_prefetch()


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(file name, thread name) of every checkpoint file opened for reading."""
    seen: list[tuple[str, str]] = []
    original = reader.Checkpoint.open

    def spy(self: reader.Checkpoint, name: str):  # type: ignore[no-untyped-def]
        seen.append((name, threading.current_thread().name))
        return original(self, name)

    monkeypatch.setattr(reader.Checkpoint, "open", spy)
    return seen


def _mid_window_checkpoint(tmp_path: Path, lora: bool = False):
    config = make_config("span", lora)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=7)  # 2 of a 3-micro-batch window done: pending gradients are saved
    assert session.pending_micro_batches > 0
    uri = str(tmp_path / "ckpt")
    session.save_state(uri)
    tail = run_direct(session, plan, start=7)
    return config, plan, uri, tail, snapshot(session)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_prefetched_restore_reads_each_state_file_once_in_the_background_and_continues_bitwise(tmp_path, opens, lora):
    config, plan, uri, tail, expected = _mid_window_checkpoint(tmp_path, lora)
    opens.clear()
    prefetch_state(uri)  # before the model is built, as a worker does
    resumed = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    resumed.load_state(uri)
    assert run_direct(resumed, plan, start=7) == tail
    assert_bitwise_equal(snapshot(resumed), expected)

    state_files = [name for name in PREFETCHED_FILES if name != layout.BEST_WEIGHTS_FILE]
    for name in state_files:
        assert [thread for opened, thread in opens if opened == name] == ["checkpoint-prefetch"], (name, opens)
    assert [thread for opened, thread in opens if opened == layout.WEIGHTS_FILE] == ["MainThread"]
    assert reader._pending is None  # taken by the load


def test_without_a_prefetch_the_restore_reads_the_state_files_itself(tmp_path, opens):
    config, plan, uri, tail, expected = _mid_window_checkpoint(tmp_path)
    opens.clear()
    resumed = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    resumed.load_state(uri)
    assert run_direct(resumed, plan, start=7) == tail
    assert_bitwise_equal(snapshot(resumed), expected)
    assert {thread for _, thread in opens} == {"MainThread"}


def test_a_damaged_state_file_read_in_the_background_fails_load_state_and_leaves_the_session_fresh(tmp_path):
    config, plan, uri, _, _ = _mid_window_checkpoint(tmp_path)
    damaged = Path(uri) / layout.OPTIMIZER_TENSORS_FILE
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0x01  # one bit in the last moment tensor: size unchanged, found only by the hash
    damaged.write_bytes(bytes(data))
    prefetch_state(uri)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    with pytest.raises(CheckpointDamagedError, match=f"{layout.OPTIMIZER_TENSORS_FILE}.*does not match"):
        session.load_state(uri)
    assert session.is_fresh  # nothing was restored: a fresh session, as without the prefetch
    assert run_direct(session, plan, stop=1)  # and it still trains


def test_a_prefetch_is_handed_only_to_the_same_checkpoint(tmp_path):
    config, plan, uri, _, _ = _mid_window_checkpoint(tmp_path)
    other = str(tmp_path / "other")
    shutil.copytree(uri, other)
    prefetch_state(uri)
    assert open_checkpoint(other).prefetched(layout.GRADIENTS_FILE) is None  # another uri: not handed over
    assert reader._pending is not None and reader._pending.uri == uri  # still waiting for its own

    # The same uri with another index (the directory replaced meanwhile): not handed over, and dropped.
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=2)
    shutil.rmtree(uri)
    session.save_state(uri)
    assert open_checkpoint(uri).prefetched(layout.GRADIENTS_FILE) is None
    assert reader._pending is None


def _managed_with_best():
    """A managed run (span, validation every step, best weights kept) trained until it has a best and no validation
    is due: its checkpoint holds the best-weights blob reference."""
    config = make_config(
        "span", False, eval_strategy="steps", eval_steps=1, save_best=True, num_epochs=2, metric_for_best="eval_loss"
    )
    plan = make_plan("span", config)
    managed = ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )
    while not managed.has_best or managed.validation_due:
        managed.run(until=managed.cursor + 1)
    return config, plan, managed


def _fresh_managed(config, plan):  # type: ignore[no-untyped-def]
    return ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )


def test_a_managed_restore_takes_its_best_weights_from_the_prefetch(tmp_path, opens):
    config, plan, managed = _managed_with_best()
    assert managed.best_state is not None
    uri = str(tmp_path / "managed")
    managed.save_state(uri)
    opens.clear()
    prefetch_state(uri)
    resumed = _fresh_managed(config, plan)
    resumed.load_state(uri)
    assert_bitwise_equal(resumed.best_state, managed.best_state)
    assert [thread for name, thread in opens if name == layout.BEST_WEIGHTS_FILE] == ["checkpoint-prefetch"]
    assert_bitwise_equal(snapshot(resumed.session), snapshot(managed.session))


def test_the_worker_build_restores_through_the_prefetch_and_continues_bitwise(tmp_path, opens):
    """`runtime.worker_setup.build_training` with a checkpoint to restore (what a restarted worker runs): the state
    files are read in the prefetch thread, the weights in the caller's, and the run continues to the same bits."""
    from prefect_gliner2.runtime.protocol import WorkerSpec
    from prefect_gliner2.runtime.rundir import RunDirectory
    from prefect_gliner2.runtime.worker_setup import build_training
    from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig

    from support.config import training_config
    from support.flow import make_inputs, tiny_model_dir

    inputs = make_inputs(tmp_path / "data")
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(training_config()), architecture="span")
    run_dir = RunDirectory(str(tmp_path / "runs"), "prefetch")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(inputs["valid"]))
    spec = WorkerSpec(tiny_model_dir(tmp_path, "span"), run_dir.manifest_uri, 1)

    _, first = build_training(spec, None)
    first.run(until=3)  # batch 3 of 2-micro-batch windows: mid-window, pending gradients saved
    assert first.session.pending_micro_batches > 0
    uri = str(tmp_path / "ckpt")
    first.save_state(uri)
    first.run(until=plan.batch_count)
    opens.clear()

    _, resumed = build_training(spec, uri)
    for name in (layout.RNG_FILE, layout.GRADIENTS_FILE, layout.OPTIMIZER_TENSORS_FILE):
        assert [thread for opened, thread in opens if opened == name] == ["checkpoint-prefetch"], (name, opens)
    assert [thread for opened, thread in opens if opened == layout.WEIGHTS_FILE] == ["MainThread"]
    assert reader._pending is None
    resumed.run(until=plan.batch_count)
    assert_bitwise_equal(snapshot(resumed.session), snapshot(first.session))


@pytest.mark.parametrize("prefetch", [False, True], ids=["direct", "prefetched"])
def test_a_restore_drops_its_checkpoint_from_the_page_cache_and_other_reads_keep_it(tmp_path, prefetch):
    config, plan, uri, tail, expected = _mid_window_checkpoint(tmp_path)
    folder = Path(uri)
    read_through_cache(folder)
    every = {path.name for path in folder.iterdir()}
    assert set(cached_files(folder)) == every  # all of it cached before (the check below would pass vacuously)

    read_checkpoint(uri)  # a verification (the worker's re-check after a failed load): the cache stays
    warm = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    warm.load_weights(uri)  # a warm start from these weights (another run may start from them too): it stays
    assert set(cached_files(folder)) == every

    if prefetch:
        prefetch_state(uri)
    resumed = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    resumed.load_state(uri)
    # every file the restore read, in either thread, left the cache; the small index (read by the flow too) stays
    assert cached_files(folder) == {INDEX_FILE: cached_pages(folder / INDEX_FILE)[1]}
    assert run_direct(resumed, plan, start=7) == tail  # and the same bits as ever
    assert_bitwise_equal(snapshot(resumed), expected)


def test_a_managed_restore_drops_its_own_files_and_keeps_the_shared_best_weights_blob(tmp_path):
    config, plan, managed = _managed_with_best()
    uri = str(tmp_path / "managed")
    managed.save_state(uri)
    ref = open_checkpoint(uri).refs[layout.BEST_WEIGHTS_FILE]
    blob = (Path(uri) / ref.path).resolve()
    assert not blob.is_relative_to(Path(uri).resolve())  # stored beside, shared by the run's checkpoints
    read_through_cache(Path(uri))
    blob.read_bytes()
    assert cached_pages(blob)[0] == cached_pages(blob)[1] > 0

    prefetch_state(uri)
    resumed = _fresh_managed(config, plan)
    resumed.load_state(uri)
    assert set(cached_files(Path(uri))) == {INDEX_FILE}
    assert cached_pages(blob)[0] == cached_pages(blob)[1]  # the next checkpoint refers to it again: kept
    assert_bitwise_equal(resumed.best_state, managed.best_state)
    assert_bitwise_equal(snapshot(resumed.session), snapshot(managed.session))
