"""The managed driver's path: losses queued on the device, read once per update, refused before anything applies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from prefect_gliner2.training import SessionStateError, TrainingNumericsError, TrainingSession

from support.session import assert_bitwise_equal, new_session, run_direct, run_queued, snapshot


def test_a_queued_non_finite_loss_is_refused_before_the_update_and_before_a_checkpoint(tmp_path):
    """queue_forward_backward leaves the loss on the device; the update's one read refuses a non-finite one before
    AdamW writes anything, and a mid-window checkpoint refuses it before any file is committed."""
    session, plan = new_session("span", False)
    before = {n: t.detach().clone() for n, t in session.model.state_dict().items()}
    session.queue_forward_backward(plan.batch(0))
    with torch.no_grad():
        session.model.encoder.embeddings.LayerNorm.weight.fill_(float("nan"))
        before["encoder.embeddings.LayerNorm.weight"].fill_(float("nan"))
    session.queue_forward_backward(plan.batch(1))  # no host read yet: no error here
    with pytest.raises(TrainingNumericsError, match=r"non-finite loss \(nan\) in micro-batch 2 of 2"):
        session.optim_step()
    assert all(t.numpy().tobytes() == before[n].numpy().tobytes() for n, t in session.model.state_dict().items())
    assert session.step == 0 and not session.engine.optimizer.state
    with pytest.raises(SessionStateError, match="unusable"):
        session.take_losses()

    session, plan = new_session("span", False)
    with torch.no_grad():
        session.model.encoder.embeddings.LayerNorm.weight.fill_(float("inf"))
    session.queue_forward_backward(plan.batch(0))
    with pytest.raises(TrainingNumericsError, match="non-finite loss"):
        session.save_state(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(SessionStateError, match="unusable"):
        session.save_state(str(tmp_path / "ckpt"))


def test_queued_losses_equal_forward_backward_and_the_update_reads_the_device_once(monkeypatch):
    """The managed driver's path (queue_forward_backward, optim_step, take_losses) returns the losses and weights
    of the public forward_backward path bit for bit, and session code reads device tensors to the host once per
    update (the update's scalars in one transfer), never per micro-batch."""
    public, plan = new_session("boundary", False)
    expected = run_direct(public, plan)
    queued, _ = new_session("boundary", False)  # after: sessions in one process share torch's global generator
    reads: list[str] = []
    package = str(Path(sys.modules[TrainingSession.__module__].__file__).parent)  # session_core's folder
    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(package):
                reads.append(f"{_name} in {Path(caller).name}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    losses, updates = run_queued(queued, plan)
    monkeypatch.undo()
    assert updates == plan.max_steps and len(losses) == plan.batch_count
    assert losses == expected
    assert reads == ["tolist in guards.py"] * updates, reads
    assert_bitwise_equal(snapshot(queued), snapshot(public))

    mixed, _ = new_session("boundary", False)  # forward_backward takes its own loss, the queued ones stay
    mixed.queue_forward_backward(plan.batch(0))
    assert mixed.forward_backward(plan.batch(1)) == expected[1]
    assert mixed.take_losses() == [expected[0]] and mixed.take_losses() == []
