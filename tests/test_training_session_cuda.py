"""CUDA qualification: span/boundary x fp32/bf16 x full/LoRA, bitwise continuation in a fresh process.

Run with `CUBLAS_WORKSPACE_CONFIG=:4096:8 pytest -q tests/test_training_session_cuda.py` on a CUDA machine. Without
CUDA the whole module skips; bf16 cases skip on devices without hardware-native bf16 (a T4 runs four cases and skips
four). A CPU skip is not GPU qualification.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch

from prefect_gliner2.training import TrainingSession

from support.session import (
    assert_bitwise_equal,
    make_config,
    make_model,
    make_plan,
    run_child,
    run_direct,
    run_queued,
    snapshot,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")

MATRIX = [
    (arch, precision, lora) for arch in ("span", "boundary") for precision in ("fp32", "bf16") for lora in (False, True)
]


def _native_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


@pytest.mark.parametrize(
    ("arch", "precision", "lora"), MATRIX, ids=[f"{a}-{p}-{'lora' if lo else 'full'}" for a, p, lo in MATRIX]
)
def test_cuda_exact_continuation_and_export(arch, precision, lora, tmp_path):
    if precision == "bf16" and not _native_bf16():
        pytest.skip(f"{torch.cuda.get_device_name()} has no hardware-native bf16")
    overrides = {"bf16": precision == "bf16"}
    config = make_config(arch, lora, **overrides)
    plan = make_plan(arch, config)
    session = TrainingSession(make_model(arch), config, max_steps=plan.max_steps, device="cuda")
    assert all(p.device.type == "cuda" for p in session.model.parameters())
    if precision == "fp32":
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    cut = 6
    run_direct(session, plan, stop=cut + 1)
    assert session.pending_micro_batches == 2
    session.save_state(str(tmp_path / "ckpt"))
    tail = run_direct(session, plan, start=cut + 1)
    expected = snapshot(session)
    session.export_weights(str(tmp_path / "export"))

    child = run_child(
        "session_child",
        {
            "arch": arch,
            "lora": lora,
            "mode": "direct",
            "start": cut + 1,
            "device": "cuda",
            "config": overrides,
            "checkpoint": str(tmp_path / "ckpt"),
            "out": str(tmp_path / "out.st"),
        },
    )
    assert child["losses"] == tail
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "out.st")), expected)
    assert (tmp_path / "export" / "model.safetensors").exists()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_background_snapshot_writes_the_synchronous_checkpoints_bytes(precision, tmp_path):
    """A background checkpoint's snapshot (host copies of CUDA tensors taken at the step boundary) written after
    training moved on holds the same bytes as the synchronous checkpoint taken at that boundary."""
    from prefect_gliner2.session_core.checkpoint import write_checkpoint

    if precision == "bf16" and not _native_bf16():
        pytest.skip(f"{torch.cuda.get_device_name()} has no hardware-native bf16")
    config = make_config("span", False, bf16=precision == "bf16")
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps, device="cuda")
    cut = 6
    run_direct(session, plan, stop=cut + 1)  # mid-accumulation: pending gradients are part of the state
    session.save_state(str(tmp_path / "sync"))
    files, meta = session.state_payload(snapshot=True)
    run_direct(session, plan, start=cut + 1)  # the live tensors move on while the snapshot waits
    write_checkpoint(str(tmp_path / "background"), files, meta)
    written = sorted(p.name for p in (tmp_path / "sync").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "background").iterdir())
    for name in written:
        assert (tmp_path / "sync" / name).read_bytes() == (tmp_path / "background" / name).read_bytes(), name


@pytest.mark.parametrize("arch", ["span", "boundary"])
def test_cuda_managed_path_reads_the_device_once_per_update_and_equals_the_public_path(arch):
    """The managed driver's path (queue_forward_backward, optim_step, take_losses) on CUDA: the losses and state of
    the public forward_backward path bit for bit, and session code synchronises with the GPU once per update (the
    update's scalars in one transfer; torch's sync debug mode names each synchronising call's Python frame)."""
    config = make_config(arch, False)
    plan = make_plan(arch, config)
    public = TrainingSession(make_model(arch), config, max_steps=plan.max_steps, device="cuda")
    expected = run_direct(public, plan)
    expected_state = snapshot(public)
    public.close()
    queued = TrainingSession(make_model(arch), config, max_steps=plan.max_steps, device="cuda")
    package = str(Path(sys.modules[TrainingSession.__module__].__file__).parent)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses, updates = run_queued(queued, plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    ours = [f"{Path(w.filename).name}:{w.lineno}" for w in syncs if w.filename.startswith(package)]
    assert updates == plan.max_steps and losses == expected
    assert len(ours) == updates and set(ours) == {ours[0]} and ours[0].startswith("guards.py"), (ours, len(syncs))
    assert_bitwise_equal(snapshot(queued), expected_state)
