"""The engine's guards: what native training would zero or skip silently raises instead.

A sample the model could not process, a batch without a loss, a loss that does not require grad while parameters
are trainable (a forward hook on the model, at once), a non-finite loss, and non-finite gradients (an optimizer
pre-step hook that reads the norm native clipping computed anyway: no second pass over the gradients).

The host reads the device as seldom as native training does. A training micro-batch's loss stays on the device
(queued) until something needs its value: the optimizer pre-step hook reads every queued loss, the gradient norm,
native's skip counter and the last micro-batch's loss components in one transfer, and refuses the update if any is
not finite, before AdamW writes anything. So an accelerator is not drained between the forward and the backward or
after each micro-batch, and the host prepares the next batch while the update runs. A non-finite loss still
reaches the backward (native zeroes its gradients on the device); the refusal marks the session unusable, so those
gradients are never applied or saved.
Touches gliner2 internals: the trainer's ``_last_grad_norm``, ``_skip_counter`` and ``_last_train_outputs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from gliner2.training.trainer import ExtractorTrainer

from prefect_gliner2.session_core.errors import RecordError, TrainingNumericsError

__all__ = ["LOSS_COMPONENTS", "EngineGuards"]

LOSS_COMPONENTS = ("classification_loss", "structure_loss", "count_loss")


class EngineGuards(ExtractorTrainer):
    """The forward and optimizer hooks that refuse lossy native paths (part of ``SessionEngine``)."""

    _queue_loss: bool  # set while a training micro-batch runs (``SessionEngine.backward``)
    _queued_losses: list[torch.Tensor]  # training losses still on the device, oldest first
    _read_losses: list[float]  # their values once read, until ``take_losses``
    _step_readings: dict[str, float] | None  # the update's scalars, read by the pre-step hook

    def _read_queued(self, extra: Sequence[Any] = ()) -> list[float]:
        """One host read of the queued micro-batch losses and the scalars `extra` (tensors or numbers); returns
        `extra`'s values. The losses' values move to ``_read_losses``; a non-finite one raises, naming its place."""
        queued = self._queued_losses
        items = [*queued, *extra]
        tensors = [value for value in items if isinstance(value, torch.Tensor)]
        read: list[float] = []
        if tensors:
            wide = torch.float32 if tensors[0].device.type == "mps" else torch.float64  # exact for f32/bf16/int
            read = torch.stack([t.detach().reshape(()).to(wide) for t in tensors]).tolist()
        values: list[float] = []
        taken = iter(read)
        for value in items:
            values.append(next(taken) if isinstance(value, torch.Tensor) else float(value or 0.0))
        losses = values[: len(queued)]
        self._queued_losses = []
        for position, loss in enumerate(losses):
            if not math.isfinite(loss):
                raise TrainingNumericsError(
                    f"non-finite loss ({loss:.4g}) in micro-batch {len(self._read_losses) + position + 1} of "
                    f"{len(self._read_losses) + len(losses)} since the last update; nothing was applied. Check the "
                    "data and learning rate, then resume from the last checkpoint"
                )
        self._read_losses.extend(losses)
        return values[len(queued) :]

    def last_loss(self) -> float:
        """The value of the newest training micro-batch's loss (one host read), leaving earlier values for
        `take_losses`; raises `TrainingNumericsError` for a non-finite queued one."""
        if self._queued_losses:
            self._read_queued()
        return self._read_losses.pop()

    def take_losses(self) -> list[float]:
        """The values of every training micro-batch loss since the last call, in order (one host read, if any is
        still on the device); raises `TrainingNumericsError` for a non-finite one."""
        if self._queued_losses:
            self._read_queued()
        taken, self._read_losses = self._read_losses, []
        return taken

    def _refuse_non_finite_gradients(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer pre-step hook: refuse the update when a queued loss or the gradient norm native clipping just
        computed is not finite (the norm is, exactly when some gradient is NaN or infinite), so AdamW never writes
        them into the weights. Reads the update's scalars in the same transfer (``_step_readings``).

        Reusing that norm costs one scalar read instead of a second pass over every gradient. A trainer_factory
        whose `_optimizer_step` does not clip leaves no norm behind: then one fused norm is taken here."""
        self._step_readings = self._read_step_scalars()

    def _read_step_scalars(self) -> dict[str, float]:
        norm = self._last_grad_norm
        if norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self._trainable if p.grad is not None])
        outputs = self._last_train_outputs or {}
        components = [outputs.get(key) if hasattr(outputs, "get") else None for key in LOSS_COMPONENTS]
        value, skipped, *parts = self._read_queued([norm, self._skip_counter, *components])
        if skipped:
            raise TrainingNumericsError(
                f"gliner2 zeroed {int(skipped)} non-finite micro-batch loss(es); the update was not applied. Check the "
                "data and learning rate, then resume from the last checkpoint"
            )
        if not math.isfinite(value):
            raise TrainingNumericsError(
                f"non-finite gradients (total gradient norm {value}); the update was not applied. Check the data and "
                "learning rate (DoRA on a fresh boundary head is a known cause), then resume from the last checkpoint"
            )
        return {"grad_norm": value, **dict(zip(LOSS_COMPONENTS, parts, strict=True))}

    def _guard_outputs(self, module: torch.nn.Module, args: Any, outputs: Any) -> None:
        if not self._guard_active:
            return
        loss = outputs.get("total_loss") if hasattr(outputs, "get") else None
        rows = self._expected_rows
        valid = outputs.get("batch_size") if hasattr(outputs, "get") else None
        if isinstance(valid, int) and valid != rows:
            raise RecordError(
                f"the model could not process {rows - valid} of {rows} sample(s) in this batch (gliner2 printed "
                "the per-sample error above); nothing was applied. Fix or remove those records and re-plan"
            )
        if loss is None:
            raise RecordError(
                "this batch produced no loss (no supervised target in any sample); nothing was applied. "
                "Every training record needs at least one task with targets"
            )
        if torch.is_grad_enabled() and self._trainable and not loss.requires_grad:
            raise TrainingNumericsError(
                "the loss does not require grad although parameters are trainable (reentrant activation "
                "checkpointing with frozen embeddings does this); refusing to substitute a zero loss"
            )
        if self._queue_loss:  # a training micro-batch: checked with the next read (see the module docstring)
            self._queued_losses.append(loss.detach())
            return None
        if not bool(torch.isfinite(loss.detach()).all()):
            raise TrainingNumericsError(
                f"non-finite loss ({float(loss.detach()):.4g}) in this batch; nothing was applied. Check the data "
                "and learning rate, then resume from the last checkpoint"
            )
