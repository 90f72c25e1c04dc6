"""Streaming, verified checkpoint I/O: bitwise round trips, corruption caught in the same pass (BLAKE3 of format 4,
chunked sha256 of format 3, plain sha256 of format 2), best weights stored once in the blob store, format-2 and
format-3 checkpoints still resumed, and a clear refusal of format-1 checkpoints for resuming."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import blake3
import pytest
import safetensors
import safetensors.torch
import torch

from prefect_gliner2.session_core import checkpoint as checkpoint_mod
from prefect_gliner2.session_core.checkpoint import digest as digest_mod
from prefect_gliner2.session_core.checkpoint import open_checkpoint, read_checkpoint, write_checkpoint
from prefect_gliner2.training import (
    CheckpointDamagedError,
    CheckpointError,
    ManagedTraining,
    SessionStateError,
    StateMismatchError,
    TrainingSession,
)
from prefect_gliner2.training.state import read_tensors, write_tensors

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
    assert index["version"] == checkpoint_mod.FORMAT_VERSION == 4


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
    with pytest.raises(CheckpointError, match=f"{name}.*does not match its recorded blake3"):
        victim.load_state(str(tmp_path / "ckpt"))
    assert_bitwise_equal(snapshot(victim), untouched)
    assert victim.is_fresh  # nothing was applied: it can still load an intact checkpoint
    with pytest.raises(CheckpointError, match="blake3"):
        read_checkpoint(str(tmp_path / "ckpt"))  # the full verification the flow process uses sees it too


def test_a_corrupted_weights_byte_is_caught_in_the_same_pass_and_fails_the_session(tmp_path):
    session, plan = new_session()
    run_direct(session, plan, stop=3)
    session.save_state(str(tmp_path / "ckpt"))
    path = tmp_path / "ckpt" / "weights.safetensors"
    _flip_byte(path, os.path.getsize(path) // 2)

    victim, _ = new_session()
    with pytest.raises(CheckpointError, match="weights.safetensors.*does not match its recorded blake3"):
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
    for name in blobs:  # named by their scheme and BLAKE3 digest
        assert name == f"blake3-{blake3.blake3((root / 'blobs' / name).read_bytes()).hexdigest()}.safetensors"
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
    with pytest.raises(CheckpointError, match="best.safetensors.*blake3"):
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


def _flipped_bytes_are_caught(path: Path, offsets: list[int], expected: dict) -> None:
    """Each flipped byte fails the streamed read at its end; flipped back, the file reads intact again."""
    size = os.path.getsize(path)
    for offset in offsets:
        _flip_byte(path, offset)
        with pytest.raises(CheckpointDamagedError, match="does not match its recorded"):
            with open_checkpoint(str(path.parent)).open(path.name) as reader:
                reader.readinto(bytearray(size))
        _flip_byte(path, offset)
    with open_checkpoint(str(path.parent)).open(path.name) as reader:
        assert_bitwise_equal(read_tensors(reader), expected)


@pytest.mark.parametrize("inline_below", [0, 1 << 20])  # every piece to the helper thread, or small ones inline
def test_blake3_digests_follow_their_definition_and_any_flipped_byte_is_caught(tmp_path, monkeypatch, inline_below):
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 4096)  # many pieces per file, straddling tensors
    monkeypatch.setattr(digest_mod, "INLINE_BELOW", inline_below)
    monkeypatch.setattr(digest_mod, "HASH_THREADS", 3)
    tensors = {f"t{i}": torch.randn(97 * (i + 1)) for i in range(12)}
    write_checkpoint(str(tmp_path / "c"), {"t.safetensors": lambda handle: write_tensors(handle, tensors)}, {})
    path = tmp_path / "c" / "t.safetensors"
    entry = json.loads((tmp_path / "c" / "checkpoint.json").read_text())["files"]["t.safetensors"]
    data = path.read_bytes()
    assert entry == {"blake3": blake3.blake3(data).hexdigest(), "bytes": len(data)}  # the plain BLAKE3 of the file
    assert len(data) > 7 * 4096 and len(data) % 4096  # many full pieces and a short last one
    read_checkpoint(str(tmp_path / "c"))
    # first and last bytes, the header, both sides of piece and BLAKE3 chunk (1 KiB) boundaries, the middle
    offsets = [0, 9, 1023, 1024, 4095, 4096, 4097, 3 * 4096 - 1, len(data) // 2, len(data) - len(data) % 4096]
    _flipped_bytes_are_caught(path, [*offsets, len(data) - 2, len(data) - 1], tensors)


def _chunked_sha256(data: bytes, chunk: int) -> str:
    """The format-3 file digest, computed here from its definition (``checkpoint.format``'s docstring)."""
    digests = b"".join(hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk))
    return hashlib.sha256(f"chunked-sha256 {chunk} {len(data)}\n".encode() + digests).hexdigest()


def _as_older_format(checkpoint: Path, version: int, chunk: int = 1000) -> None:
    """Rewrite a checkpoint's index as format `version` wrote it: format 3, each file's chunked sha256 (pieces of
    `chunk` bytes) and blobs named `chunked-sha256-<hex>`; format 2, plain sha256 and blobs named `sha256-<hex>`."""

    def entry(data: bytes) -> tuple[str, dict]:
        if version == 3:
            digest = _chunked_sha256(data, chunk)
            return f"chunked-sha256-{digest}", {"chunked_sha256": digest, "chunk_bytes": chunk, "bytes": len(data)}
        digest = hashlib.sha256(data).hexdigest()
        return f"sha256-{digest}", {"sha256": digest, "bytes": len(data)}

    index_path = checkpoint / "checkpoint.json"
    index = json.loads(index_path.read_text())
    for name in index["files"]:
        index["files"][name] = entry((checkpoint / name).read_bytes())[1]
    for name, ref in index["refs"].items():
        blob = checkpoint / ref["path"]
        stem, written = entry(blob.read_bytes())
        renamed = blob.with_name(f"{stem}.safetensors")
        if not renamed.exists():
            os.link(blob, renamed)
        index["refs"][name] = {"path": f"../blobs/{renamed.name}", **written}
    index["version"] = version
    index_path.write_text(json.dumps(index, sort_keys=True, indent=1))


@pytest.mark.parametrize("version", [2, 3])
def test_older_format_checkpoints_still_resume_exactly_and_are_still_verified(tmp_path, version):
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
    _as_older_format(old, version)
    before, best = snapshot(run.session), run.best_state  # a new best is a new dict: this one stays as saved
    run.run(until=run.cursor + 3)  # what the uninterrupted run does next
    expected = snapshot(run.session)

    resumed = managed()
    resumed.load_state(str(old))
    assert_bitwise_equal(snapshot(resumed.session), before)
    assert_bitwise_equal(resumed.best_state, best)
    new = tmp_path / "checkpoints" / "new"  # format 4 now, still naming the older format's best-weights blob
    resumed.save_state(str(new))
    index = json.loads((new / "checkpoint.json").read_text())
    prefix = {2: "../blobs/sha256-", 3: "../blobs/chunked-sha256-"}[version]
    assert index["version"] == 4 and index["refs"]["best.safetensors"]["path"].startswith(prefix)
    assert all(set(entry) == {"blake3", "bytes"} for entry in index["files"].values())
    again = managed()
    again.load_state(str(new))
    assert_bitwise_equal(snapshot(again.session), before)
    again.run(until=again.cursor + 3)
    assert_bitwise_equal(snapshot(again.session), expected)  # resumed bitwise through the older format
    assert all(checkpoint_mod.is_blob_name(p.name) for p in (tmp_path / "checkpoints" / "blobs").iterdir())

    scheme = {2: "sha256", 3: "chunked sha256"}[version]
    for name in ("optimizer.safetensors", "weights.safetensors"):
        victim = tmp_path / f"damaged-{name}"
        shutil.copytree(old, victim / "old")
        _flip_byte(victim / "old" / name, os.path.getsize(victim / "old" / name) - 3)
        os.symlink(tmp_path / "checkpoints" / "blobs", victim / "blobs")
        with pytest.raises(CheckpointDamagedError, match=f"{name}.*does not match its recorded {scheme}"):
            managed().load_state(str(victim / "old"))


def test_format_3_chunked_digests_catch_a_flipped_byte_anywhere(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 4096)  # reads straddle the 1000-byte hash pieces
    monkeypatch.setattr(digest_mod, "HASH_THREADS", 3)
    tensors = {f"t{i}": torch.randn(97 * (i + 1)) for i in range(12)}
    write_checkpoint(str(tmp_path / "c"), {"t.safetensors": lambda handle: write_tensors(handle, tensors)}, {})
    _as_older_format(tmp_path / "c", 3, chunk=1000)
    path = tmp_path / "c" / "t.safetensors"
    size = os.path.getsize(path)
    read_checkpoint(str(tmp_path / "c"))
    _flipped_bytes_are_caught(path, [0, 999, 1000, 4096, size // 2, size - size % 1000, size - 1], tensors)


def test_an_index_entry_without_a_valid_digest_is_damage(tmp_path):
    write_checkpoint(str(tmp_path / "c"), {"a.bin": b"abc"}, {})
    index_path = tmp_path / "c" / "checkpoint.json"
    good = json.loads(index_path.read_text())
    for entry, what in (
        ({"bytes": 3}, "records no digest"),
        ({"blake3": "12ab", "bytes": 3}, "invalid blake3"),
        ({"chunked_sha256": "0" * 64, "chunk_bytes": 0, "bytes": 3}, "invalid chunk_bytes"),
    ):
        index_path.write_text(json.dumps({**good, "files": {"a.bin": entry}}))
        with pytest.raises(CheckpointDamagedError, match=what):
            open_checkpoint(str(tmp_path / "c"))


def test_hash_threads_follow_the_slot_and_bad_values_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(digest_mod, "HASH_THREADS", digest_mod.HASH_THREADS)  # restored after the test
    monkeypatch.setattr(digest_mod, "CHUNK_BYTES", 40_000)  # ~30 pieces, hashed while the next is written
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


def test_a_checkpoint_naming_the_trainer_by_its_former_name_still_resumes_exactly(tmp_path):
    """Checkpoints written before the torch layer left session_core name the trainer
    ``prefect_gliner2.session_core.engine.SessionEngine``: the same trainer, so they restore bitwise; a trainer of
    another name is still refused."""
    config = make_config("span", False)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=3)
    saved = tmp_path / "checkpoint"
    session.save_state(str(saved))
    before = snapshot(session)
    run_direct(session, plan, start=3)  # RNGs are process-global: finish the original before the restore
    expected = snapshot(session)
    index_path = saved / "checkpoint.json"

    def named(trainer: str) -> None:
        index = json.loads(index_path.read_text())
        assert index["meta"]["compat"]["trainer"] == "prefect_gliner2.training.engine.SessionEngine"
        index["meta"]["compat"]["trainer"] = trainer
        index_path.write_text(json.dumps(index, sort_keys=True, indent=1))

    original = index_path.read_text()
    named("prefect_gliner2.session_core.engine.SessionEngine")
    resumed = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    resumed.load_state(str(saved))
    assert_bitwise_equal(snapshot(resumed), before)
    run_direct(resumed, plan, start=3)
    assert_bitwise_equal(snapshot(resumed), expected)

    index_path.write_text(original)
    named("somewhere.else.SessionEngine")
    with pytest.raises(StateMismatchError, match="trainer"):
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps).load_state(str(saved))
