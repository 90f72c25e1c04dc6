"""The weights digest an export records is the digest of what it wrote, computed one tensor at a time."""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import torch

from prefect_gliner2.session_core.layout import MODEL_WEIGHTS_FILE
from prefect_gliner2.training import TrainingSession
from prefect_gliner2.training.state import file_tensors_digest, tensors_digest

from support.session import make_config, make_model, make_plan, run_direct


def test_a_files_digest_read_tensor_by_tensor_equals_the_digest_of_the_whole_file_loaded(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "z.weight": torch.randn(7, 5, generator=generator),
        "a.bias": torch.randn(3, generator=generator).to(torch.bfloat16),
        "m.index": torch.arange(11, dtype=torch.int64),
        "e.empty": torch.empty(0, 4),
        "t.transposed": torch.randn(4, 6, generator=generator).t().contiguous(),
    }
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    digest = file_tensors_digest(str(path))
    assert digest == tensors_digest(safetensors.torch.load_file(str(path)).items()) == tensors_digest(tensors.items())
    tensors["z.weight"][0, 0] = torch.nextafter(tensors["z.weight"][0, 0], torch.tensor(1.0))  # one bit of one value
    safetensors.torch.save_file(tensors, str(path))
    assert file_tensors_digest(str(path)) != digest


def test_an_exports_recorded_digest_is_that_of_the_weights_it_wrote_and_of_the_live_model(tmp_path: Path) -> None:
    config = make_config("span", False)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=2)
    info = session.export_weights(str(tmp_path / "export"))
    written = safetensors.torch.load_file(str(tmp_path / "export" / MODEL_WEIGHTS_FILE))
    assert info["weights_sha256"] == tensors_digest(written.items())
    assert info["weights_sha256"] == tensors_digest(session.model.state_dict().items())
