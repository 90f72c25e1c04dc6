"""Exports and a finished run's checkpoint are written around the page cache, byte for byte what the cached path
writes: `native_save.weights_written_direct` takes over gliner2's safetensors write only where it can be exact,
and the managed driver writes only a finished run's checkpoint that way."""

from __future__ import annotations

import contextlib
import filecmp
import os
from pathlib import Path

import gliner2.models.span.model as span_module
import pytest
import safetensors.torch
import torch

import prefect_gliner2.session_core.commits as commits
import prefect_gliner2.training.weights as weights
from prefect_gliner2.session_core import direct_io
from prefect_gliner2.session_core.checkpoint import read_checkpoint
from prefect_gliner2.session_core.layout import MODEL_WEIGHTS_FILE, WEIGHTS_FILE
from prefect_gliner2.training import ManagedTraining, TrainingSession
from prefect_gliner2.training.native_save import SameBytes, checkpoint_weights_file, weights_written_direct
from prefect_gliner2.training.state import SAFETENSORS_RANK, file_tensors_digest, tensors_digest, write_tensors
from prefect_gliner2.training.weights import load_exported_model

from support.session import make_config, make_model, make_plan, run_direct

ORIGINAL = safetensors.torch.save_file


def _same_tree(left: Path, right: Path) -> None:
    compared = filecmp.dircmp(left, right)
    assert not compared.left_only and not compared.right_only, (compared.left_only, compared.right_only)
    for name in compared.common_files:
        assert (left / name).read_bytes() == (right / name).read_bytes(), name
    for name in compared.common_dirs:
        _same_tree(left / name, right / name)


def test_the_save_file_layout_is_byte_for_byte_safetensors_for_every_dtype(tmp_path: Path) -> None:
    tensors = {f"{9 - i}.{dtype}": torch.arange(5).to(dtype) for i, dtype in enumerate(SAFETENSORS_RANK)}
    tensors.update({"z.empty": torch.zeros(0, 3), "a.matrix": torch.randn(3, 4), "m.half": torch.ones(2).half()})
    ours = tmp_path / "ours.safetensors"
    with open(ours, "wb") as handle:
        write_tensors(handle, tensors, like_save_file=True)
    assert ours.read_bytes() == safetensors.torch.save(tensors)


@pytest.mark.parametrize("architecture", ["span", "boundary"])
def test_save_pretrained_inside_writes_the_same_directory_and_records_the_digest(
    tmp_path: Path, architecture: str
) -> None:
    model = make_model(architecture)
    cached, direct = tmp_path / "cached", tmp_path / "direct"
    model.save_pretrained(str(cached))
    direct.mkdir()
    with weights_written_direct(direct) as digests:
        model.save_pretrained(str(direct))
    _same_tree(cached, direct)
    # gliner2 2.1 writes its weights through save_file: the fast path ran, and its digest is the file's
    assert digests == {MODEL_WEIGHTS_FILE: file_tensors_digest(str(direct / MODEL_WEIGHTS_FILE))}
    assert digests[MODEL_WEIGHTS_FILE] == tensors_digest(model.state_dict().items())
    assert safetensors.torch.save_file is ORIGINAL and span_module.save_file is ORIGINAL


def test_calls_it_cannot_take_over_exactly_go_to_safetensors(tmp_path: Path) -> None:
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    weight = torch.randn(4, 4)
    with weights_written_direct(inside) as digests:
        safetensors.torch.save_file({"w": weight}, str(outside / "a.safetensors"))  # not under the directory
        safetensors.torch.save_file({"w": weight}, str(inside / "b.safetensors"), metadata={"format": "pt"})
        with pytest.raises(RuntimeError, match="share memory"):  # safetensors' own refusal, unchanged
            safetensors.torch.save_file({"w": weight, "v": weight[1:]}, str(inside / "c.safetensors"))
        with pytest.raises(ValueError, match="contiguous"):
            safetensors.torch.save_file({"t": weight.t()}, str(inside / "d.safetensors"))
        (inside / "e.safetensors").write_bytes(b"old")
        safetensors.torch.save_file({"w": weight}, str(inside / "e.safetensors"))  # replaces, as save_file does
        (inside / "sub").mkdir()
        safetensors.torch.save_file({"w": weight}, str(inside / "sub" / "f.safetensors"))  # anywhere under it
    assert digests == {"sub/f.safetensors": tensors_digest([("w", weight)])}
    expected = safetensors.torch.save({"w": weight})
    for path in (outside / "a.safetensors", inside / "e.safetensors", inside / "sub" / "f.safetensors"):
        assert path.read_bytes() == expected
    assert safetensors.torch.load_file(str(inside / "b.safetensors"))["w"].equal(weight)


def test_the_swap_is_undone_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(KeyError), weights_written_direct(tmp_path):
        assert safetensors.torch.save_file is not ORIGINAL and span_module.save_file is not ORIGINAL
        raise KeyError("boom")
    assert safetensors.torch.save_file is ORIGINAL and span_module.save_file is ORIGINAL


@pytest.mark.parametrize(("architecture", "lora"), [("span", False), ("boundary", True)])
def test_an_export_is_the_same_directory_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, architecture: str, lora: bool
) -> None:
    config = make_config(architecture, lora)
    plan = make_plan(architecture, config)
    session = TrainingSession(make_model(architecture), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=2)
    direct_info = session.export_weights(str(tmp_path / "direct"), merged=lora)
    monkeypatch.setattr(weights, "weights_written_direct", lambda directory, same=None: contextlib.nullcontext({}))
    cached_info = session.export_weights(str(tmp_path / "cached"), merged=lora)
    _same_tree(tmp_path / "cached", tmp_path / "direct")
    assert direct_info["weights_sha256"] == cached_info["weights_sha256"]
    assert direct_info["weights_sha256"] == file_tensors_digest(str(tmp_path / "direct" / MODEL_WEIGHTS_FILE))


def test_only_a_finished_runs_checkpoint_is_written_around_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct_files: list[str] = []
    real_open_direct = commits.open_direct

    def recording(path: os.PathLike[str], mode: int = 0o600) -> direct_io.DirectFile:
        direct_files.append(os.path.basename(path))
        return real_open_direct(path, mode)

    monkeypatch.setattr(commits, "open_direct", recording)
    config = make_config("span", False)
    plan = make_plan("span", config)
    run = ManagedTraining(TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan)
    try:
        run.train_batch()
        run.save_state(str(tmp_path / "during"))
        assert direct_files == []
        run.run()
        assert run.finished
        run.save_state(str(tmp_path / "finished"))
        assert "weights.safetensors" in direct_files and "optimizer.safetensors" in direct_files
    finally:
        run.close()
    read_checkpoint(str(tmp_path / "finished"))  # every file verified against its recorded hash


def _inode(path: Path) -> int:
    return os.stat(path).st_ino


def test_an_export_of_the_checkpointed_weights_links_the_checkpoints_file(tmp_path: Path) -> None:
    """A finished run's export of the weights its last checkpoint holds shares that checkpoint's file: the same
    export directory and digest as one written in full, the checkpoint still intact, the export still whole after
    the checkpoint is pruned."""
    config = make_config("span", False)
    plan = make_plan("span", config)
    run = ManagedTraining(TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan)
    try:
        run.run()
        final = tmp_path / "final"
        run.save_state(str(final))
        same = checkpoint_weights_file(str(final))
        assert same is not None and same.path == str(final / WEIGHTS_FILE)
        assert same.bytes == os.path.getsize(final / WEIGHTS_FILE)
        linked_info = run.export_weights(str(tmp_path / "linked"), which="final", same_bytes=same)
        written_info = run.export_weights(str(tmp_path / "written"), which="final")
    finally:
        run.close()
    assert _inode(tmp_path / "linked" / MODEL_WEIGHTS_FILE) == _inode(final / WEIGHTS_FILE)
    assert _inode(tmp_path / "written" / MODEL_WEIGHTS_FILE) != _inode(final / WEIGHTS_FILE)
    _same_tree(tmp_path / "linked", tmp_path / "written")
    assert linked_info["weights_sha256"] == written_info["weights_sha256"]
    read_checkpoint(str(final))  # every file verified against its recorded hash
    import shutil

    shutil.rmtree(final)  # retention prunes the checkpoint: the export keeps its file
    loaded = load_exported_model(str(tmp_path / "linked"))
    reference = load_exported_model(str(tmp_path / "written"))
    for (name, left), (_, right) in zip(loaded.state_dict().items(), reference.state_dict().items(), strict=True):
        assert left.equal(right), name


def test_other_bytes_or_a_failed_link_are_written_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config("span", False)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    first, second = [i for i in range(plan.batch_count) if plan.is_update(i)][:2]
    run_direct(session, plan, stop=first + 1)
    earlier = tmp_path / "earlier"
    session.save_state(str(earlier))
    same = checkpoint_weights_file(str(earlier))
    assert same is not None
    reference = session.export_weights(str(tmp_path / "reference"))
    # the weights on disk are not what this export holds (another step): written, not linked
    run_direct(session, plan, start=first + 1, stop=second + 1)
    moved = weights.export_weights(session, str(tmp_path / "moved"), same_bytes=same)
    assert _inode(tmp_path / "moved" / MODEL_WEIGHTS_FILE) != _inode(earlier / WEIGHTS_FILE)
    assert moved["weights_sha256"] != reference["weights_sha256"]
    assert moved["weights_sha256"] == file_tensors_digest(str(tmp_path / "moved" / MODEL_WEIGHTS_FILE))
    # the same digest recorded, but the file on disk has another size (damaged): written
    session.save_state(str(tmp_path / "later"))
    later = checkpoint_weights_file(str(tmp_path / "later"))
    assert later is not None
    copy = tmp_path / "short.safetensors"
    copy.write_bytes(Path(later.path).read_bytes()[:-8])
    damaged = SameBytes(str(copy), later.blake3, later.bytes)
    short = weights.export_weights(session, str(tmp_path / "short"), same_bytes=damaged)
    assert _inode(tmp_path / "short" / MODEL_WEIGHTS_FILE) != _inode(copy)

    # the link itself fails (another filesystem): written
    def cross_device(source: str, target: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    elsewhere = weights.export_weights(session, str(tmp_path / "elsewhere"), same_bytes=later)
    session.close()
    for name in ("short", "elsewhere"):
        _same_tree(tmp_path / name, tmp_path / "moved")
    assert short["weights_sha256"] == elsewhere["weights_sha256"] == moved["weights_sha256"]


def test_only_a_committed_local_checkpoint_offers_its_weights(tmp_path: Path) -> None:
    assert checkpoint_weights_file("memory://somewhere/step-000001-batch-000000") is None
    assert checkpoint_weights_file(str(tmp_path / "nothing-here")) is None
    (tmp_path / "uncommitted").mkdir()
    (tmp_path / "uncommitted" / WEIGHTS_FILE).write_bytes(b"no index")
    assert checkpoint_weights_file(str(tmp_path / "uncommitted")) is None
