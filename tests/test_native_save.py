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
import prefect_gliner2.session_core.weights as weights
from prefect_gliner2.session_core import ManagedTraining, TrainingSession, direct_io
from prefect_gliner2.session_core.checkpoint import read_checkpoint
from prefect_gliner2.session_core.layout import MODEL_WEIGHTS_FILE
from prefect_gliner2.session_core.native_save import weights_written_direct
from prefect_gliner2.session_core.state import SAFETENSORS_RANK, file_tensors_digest, tensors_digest, write_tensors

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
    monkeypatch.setattr(weights, "weights_written_direct", lambda directory: contextlib.nullcontext({}))
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
