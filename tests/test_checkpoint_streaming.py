"""Streaming, verified checkpoint I/O: bitwise round trips, corruption caught in the same pass (chunked sha256 of
format 3, plain sha256 of format 2), best weights stored once in the blob store, format-2 checkpoints still resumed,
and a clear refusal of format-1 checkpoints for resuming."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from prefect_gliner2.session_core import (
    CheckpointDamagedError,
    CheckpointError,
    ManagedTraining,
    SessionStateError,
    TrainingSession,
)
from prefect_gliner2.session_core import checkpoint as checkpoint_mod
from prefect_gliner2.session_core.checkpoint import digest as digest_mod
from prefect_gliner2.session_core.checkpoint import open_checkpoint, read_checkpoint, write_checkpoint
from prefect_gliner2.session_core.state import read_tensors, write_tensors

from support.session import (
    assert_bitwise_equal,
    eval_records,
    make_config,
    make_model,
    make_plan,
    run_direct,
    snapshot,
)


def new_session(**overrides):
    config = make_config("span", False, **overrides)
    plan = make_plan("span", config)
    return TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_streaming_round_trip_is_bitwise_and_the_files_are_plain_safetensors(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 4096)  # many chunks per file: the chunked paths run
    session, plan = new_session()
    run_direct(session, plan, stop=4)  # mid-window: pending gradients and AdamW moments are both present
    assert session.pending_micro_batches == 1
    session.save_state(str(tmp_path / "ckpt"))
    before = snapshot(session)
    run_direct(session, plan, start=4)  # RNGs are process-global: finish the original before the restore
    expected = snapshot(session)

    fresh, _ = new_session()
    fresh.load_state(str(tmp_path / "ckpt"))
    assert_bitwise_equal(snapshot(fresh), before)
    run_direct(fresh, plan, start=4)
    assert_bitwise_equal(snapshot(fresh), expected)

    weights = safetensors.torch.load_file(str(tmp_path / "ckpt" / "weights.safetensors"))  # the reference reader
    assert all(torch.equal(weights[n.removeprefix("param/")], t) for n, t in before.items() if n.startswith("param/"))
    with safetensors.safe_open(str(tmp_path / "ckpt" / "optimizer.safetensors"), "pt") as handle:
        assert len(list(handle.keys())) == 3 * sum(
            1 for n in before if n.startswith("optim/") and n.endswith("exp_avg")
        )
    index = json.loads((tmp_path / "ckpt" / "checkpoint.json").read_text())
    assert index["version"] == checkpoint_mod.FORMAT_VERSION == 3


def test_tensor_stream_round_trip_covers_every_stored_dtype(tmp_path):
    tensors = {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "f16": torch.randn(2, 2).to(torch.float16),
        "i64": torch.arange(6).reshape(2, 3),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(4.0),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 6).t(),  # not contiguous: written as its values
    }
    write_checkpoint(str(tmp_path / "c"), {"t.safetensors": lambda handle: write_tensors(handle, tensors)}, {})
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "c" / "t.safetensors")), tensors)
    with open_checkpoint(str(tmp_path / "c")).open("t.safetensors") as reader:
        assert_bitwise_equal(read_tensors(reader), tensors)


@pytest.mark.parametrize("name", ["gradients.safetensors", "optimizer.safetensors", "rng.safetensors", "optimizer.pt"])
def test_a_corrupted_byte_is_caught_before_the_session_changes(tmp_path, name):
    session, plan = new_session()
    run_direct(session, plan, stop=4)
    session.save_state(str(tmp_path / "ckpt"))
    path = tmp_path / "ckpt" / name
    _flip_byte(path, os.path.getsize(path) - 1)  # in the data, after the header: only the hash can tell

    victim, _ = new_session()
    untouched = snapshot(victim)
    with pytest.raises(CheckpointError, match=f"{name}.*does not match its recorded sha256"):
        victim.load_state(str(tmp_path / "ckpt"))
    assert_bitwise_equal(snapshot(victim), untouched)
    assert victim.is_fresh  # nothing was applied: it can still load an intact checkpoint
    with pytest.raises(CheckpointError, match="sha256"):
        read_checkpoint(str(tmp_path / "ckpt"))  # the full verification the flow process uses sees it too


def test_a_corrupted_weights_byte_is_caught_in_the_same_pass_and_fails_the_session(tmp_path):
    session, plan = new_session()
    run_direct(session, plan, stop=3)
    session.save_state(str(tmp_path / "ckpt"))
    path = tmp_path / "ckpt" / "weights.safetensors"
    _flip_byte(path, os.path.getsize(path) // 2)

    victim, _ = new_session()
    with pytest.raises(CheckpointError, match="weights.safetensors.*does not match its recorded sha256"):
        victim.load_state(str(tmp_path / "ckpt"))
    with pytest.raises(SessionStateError, match="unusable"):  # weights stream into the live model: start afresh
        victim.forward_backward(plan.batch(0))


def test_best_weights_are_stored_once_and_referenced_by_every_checkpoint(tmp_path):
    # eval_loss: it improves several times in a tiny run (extraction F1, the default, stays at 0 for a tiny model)
    config = make_config(
        "span", False, eval_strategy="steps", eval_steps=1, save_best=True, num_epochs=3, metric_for_best="eval_loss"
    )
    plan = make_plan("span", config)
    run = ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )
    root = tmp_path / "checkpoints"
    refs, index = [], 0
    while not run.finished:
        run.run(until=run.cursor + 1)
        if run.validation_due:
            run.validate()
        if run.has_best:
            target = root / f"c{index:03d}"
            run.save_state(str(target))
            entry = json.loads((target / "checkpoint.json").read_text())
            assert "best.safetensors" not in entry["files"]  # not copied into the checkpoint
            refs.append((run.best_step, entry["refs"]["best.safetensors"]["path"]))
            index += 1
    blobs = sorted(p.name for p in (root / "blobs").iterdir())
    best_steps = {step for step, _ in refs}
    assert len(refs) > len(best_steps) > 1  # several checkpoints per best, several bests
    assert len(blobs) == len(best_steps) == len({path for _, path in refs})  # one blob per best, shared
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no staging debris

    # restore and export are unchanged: the resumed run's best equals the live one bit for bit
    run.export_weights(str(tmp_path / "expected"), which="best")
    newest = root / f"c{index - 1:03d}"
    resumed = ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )
    resumed.load_state(str(newest))
    assert_bitwise_equal(resumed.best_state, run.best_state)
    resumed.export_weights(str(tmp_path / "resumed"), which="best")
    assert_bitwise_equal(
        safetensors.torch.load_file(str(tmp_path / "resumed" / "model.safetensors")),
        safetensors.torch.load_file(str(tmp_path / "expected" / "model.safetensors")),
    )

    blob = root / refs[-1][1].removeprefix("../")  # a damaged shared blob is caught like any checkpoint file
    _flip_byte(blob, os.path.getsize(blob) - 1)
    again = ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )
    with pytest.raises(CheckpointError, match="best.safetensors.*sha256"):
        again.load_state(str(newest))
    assert again.session.is_fresh


def test_format_1_checkpoints_are_refused_for_resume_with_a_way_forward(tmp_path):
    session, plan = new_session()
    run_direct(session, plan, stop=3)
    session.save_state(str(tmp_path / "ckpt"))
    index_path = tmp_path / "ckpt" / "checkpoint.json"
    index = json.loads(index_path.read_text())
    index["version"] = 1
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="format version 1.*load_weights"):
        new_session()[0].load_state(str(tmp_path / "ckpt"))
    warm, _ = new_session()
    report = warm.load_weights(str(tmp_path / "ckpt"))  # its weights file has the same layout: still accepted
    assert report["kind"] == "checkpoint"
    assert all(
        torch.equal(a, b)
        for a, b in zip(warm.model.state_dict().values(), session.model.state_dict().values(), strict=True)
    )


def _chunked_sha256(data: bytes, chunk: int) -> str:
    """The format-3 file digest, computed here from its definition (module docstring of checkpoint.py)."""
    digests = b"".join(hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk))
    return hashlib.sha256(f"chunked-sha256 {chunk} {len(data)}\n".encode() + digests).hexdigest()


def test_chunked_digests_follow_their_definition_and_any_flipped_byte_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(digest_mod, "HASH_CHUNK_BYTES", 1000)  # pieces straddle reads and tensors
    monkeypatch.setattr(digest_mod, "HASH_THREADS", 3)
    tensors = {f"t{i}": torch.randn(97 * (i + 1)) for i in range(12)}
    write_checkpoint(str(tmp_path / "c"), {"t.safetensors": lambda handle: write_tensors(handle, tensors)}, {})
    path = tmp_path / "c" / "t.safetensors"
    entry = json.loads((tmp_path / "c" / "checkpoint.json").read_text())["files"]["t.safetensors"]
    data = path.read_bytes()
    assert entry == {"chunked_sha256": _chunked_sha256(data, 1000), "chunk_bytes": 1000, "bytes": len(data)}
    assert len(data) % 1000 and len(data) > 20 * 1000  # a short last piece, many full ones
    read_checkpoint(str(tmp_path / "c"))

    for offset in (0, 9, 999, 1000, len(data) // 2, len(data) - len(data) % 1000, len(data) - 1):
        _flip_byte(path, offset)
        with pytest.raises(CheckpointDamagedError, match="does not match its recorded sha256"):
            with open_checkpoint(str(tmp_path / "c")).open("t.safetensors") as reader:
                reader.readinto(bytearray(len(data)))
        _flip_byte(path, offset)  # flipped back: intact again
    with open_checkpoint(str(tmp_path / "c")).open("t.safetensors") as reader:
        assert_bitwise_equal(read_tensors(reader), tensors)


def _as_format_2(checkpoint: Path) -> None:
    """Rewrite a checkpoint's index as format 2 wrote it: version 2, each file's plain sha256, blobs named by it."""
    index_path = checkpoint / "checkpoint.json"
    index = json.loads(index_path.read_text())
    for name in index["files"]:
        data = (checkpoint / name).read_bytes()
        index["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    for name, ref in index["refs"].items():
        blob = checkpoint / ref["path"]
        digest = hashlib.sha256(blob.read_bytes()).hexdigest()
        renamed = blob.with_name(f"sha256-{digest}.safetensors")
        if not renamed.exists():
            os.link(blob, renamed)
        index["refs"][name] = {"path": f"../blobs/{renamed.name}", "sha256": digest, "bytes": blob.stat().st_size}
    index["version"] = 2
    index_path.write_text(json.dumps(index, sort_keys=True, indent=1))


def test_format_2_checkpoints_still_resume_exactly_and_are_still_verified(tmp_path):
    config = make_config(
        "span", False, eval_strategy="steps", eval_steps=1, save_best=True, metric_for_best="eval_loss"
    )
    plan = make_plan("span", config)

    def managed() -> ManagedTraining:
        session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
        return ManagedTraining(session, plan, eval_examples=eval_records())

    run = managed()
    while not run.has_best or run.cursor < 3:
        run.run(until=run.cursor + 1)
        if run.validation_due:
            run.validate()
    old = tmp_path / "checkpoints" / "old"
    run.save_state(str(old))
    _as_format_2(old)
    before = snapshot(run.session)

    resumed = managed()
    resumed.load_state(str(old))
    assert_bitwise_equal(snapshot(resumed.session), before)
    assert_bitwise_equal(resumed.best_state, run.best_state)
    new = tmp_path / "checkpoints" / "new"  # format 3 now, still naming the format-2 best-weights blob
    resumed.save_state(str(new))
    index = json.loads((new / "checkpoint.json").read_text())
    assert index["version"] == 3 and index["refs"]["best.safetensors"]["path"].startswith("../blobs/sha256-")
    assert all("chunked_sha256" in entry for entry in index["files"].values())
    again = managed()
    again.load_state(str(new))
    assert_bitwise_equal(snapshot(again.session), before)
    assert all(checkpoint_mod.is_blob_name(p.name) for p in (tmp_path / "checkpoints" / "blobs").iterdir())

    for name in ("optimizer.safetensors", "weights.safetensors"):
        victim = tmp_path / f"damaged-{name}"
        shutil.copytree(old, victim / "old")
        _flip_byte(victim / "old" / name, os.path.getsize(victim / "old" / name) - 3)
        os.symlink(tmp_path / "checkpoints" / "blobs", victim / "blobs")
        with pytest.raises(CheckpointDamagedError, match=f"{name}.*does not match its recorded sha256"):
            managed().load_state(str(victim / "old"))


def test_hash_threads_follow_the_slot_and_bad_values_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_mod, "HASH_THREADS", digest_mod.HASH_THREADS)  # restored after the test
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 40_000)
    monkeypatch.setattr(digest_mod, "HASH_CHUNK_BYTES", 65_536)  # ~18 pieces: several threads share them
    tensors = {"w": torch.randn(300_000)}
    digests = []
    for threads in (1, 2, 64):
        checkpoint_mod.set_hash_threads(threads)
        assert digest_mod.HASH_THREADS == min(8, threads)
        write_checkpoint(str(tmp_path / f"c{threads}"), {"w.safetensors": lambda h: write_tensors(h, tensors)}, {})
        digests.append(json.loads((tmp_path / f"c{threads}" / "checkpoint.json").read_text())["files"])
    assert digests[0] == digests[1] == digests[2]  # the digest does not depend on how many threads computed it
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CheckpointError, match="hash threads must be a positive int"):
            checkpoint_mod.set_hash_threads(bad)
