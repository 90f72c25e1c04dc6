"""The engine's guards: what native training would zero or skip silently raises instead.

A sample the model could not process, a batch without a loss, a loss that does not require grad while parameters
are trainable, a non-finite loss (a forward hook on the model), and non-finite gradients (an optimizer pre-step hook
that reads the norm native clipping computed anyway: no second pass over the gradients).
Touches gliner2 internals: the trainer's ``_last_grad_norm``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gliner2.training.trainer import ExtractorTrainer

from prefect_gliner2.session_core.errors import RecordError, TrainingNumericsError

__all__ = ["EngineGuards"]


class EngineGuards(ExtractorTrainer):
    """The forward and optimizer hooks that refuse lossy native paths (part of ``SessionEngine``)."""

    def _refuse_non_finite_gradients(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer pre-step hook: refuse the update when the gradient norm native clipping just computed is not
        finite (exactly when some gradient is NaN or infinite), so AdamW never writes them into the weights.

        Reusing that norm costs one scalar read instead of a second pass over every gradient. A trainer_factory
        whose `_optimizer_step` does not clip leaves no norm behind: then one fused norm is taken here."""
        norm = self._last_grad_norm
        if norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self._trainable if p.grad is not None])
        value = float(norm)
        if not math.isfinite(value):
            raise TrainingNumericsError(
                f"non-finite gradients (total gradient norm {value}); the update was not applied. Check the data and "
                "learning rate (DoRA on a fresh boundary head is a known cause), then resume from the last checkpoint"
            )

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
        if not bool(torch.isfinite(loss.detach()).all()):
            raise TrainingNumericsError(
                f"non-finite loss ({float(loss.detach()):.4g}) in this batch; nothing was applied. Check the data "
                "and learning rate, then resume from the last checkpoint"
            )
