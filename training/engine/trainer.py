"""SessionEngine: gliner2's native trainer driven one bounded operation at a time (the step operations).

``prepare`` builds the optimizer, schedule and scaler as native ``train()`` does; ``backward`` runs one micro-batch
through ``_backward_one`` and leaves its loss on the device; ``step`` applies one update through
``_renormalize_partial_accumulation`` and ``_optimizer_step``, whose pre-step hook reads the update's scalars once
(it also reads the skip counter native ``_flush_delayed_counters`` would read after the step); ``evaluate_loss``
and ``extract`` run in eval mode without drawing any random state. Touches gliner2 internals: those methods,
``_create_optimizer``, ``_last_grad_norm``, ``_last_train_outputs`` and the finite-gradient hooks
(``_finite_grad_hook_handles``, ``_install_finite_grad_hooks``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from gliner2.training.trainer import get_scheduler

from prefect_gliner2.session_core.errors import TrainingNumericsError
from prefect_gliner2.training.engine.guards import LOSS_COMPONENTS, EngineGuards
from prefect_gliner2.training.engine.lora import unwrap
from prefect_gliner2.training.engine.rng import preserved_rng, private_python_rng
from prefect_gliner2.training.engine.setup import EngineSetup
from prefect_gliner2.training.engine.state import EngineState

__all__ = ["LOSS_KEYS", "Pair", "SessionEngine"]

Pair = tuple[str, dict[str, Any]]
LOSS_KEYS = ("total_loss", "classification_loss", "structure_loss", "count_loss")


class SessionEngine(EngineGuards, EngineState, EngineSetup):
    """gliner2's native trainer, driven one bounded operation at a time (see the package docstring)."""

    _finite_grad_hook_handles: list[Any]

    def prepare(self, max_steps: int) -> None:
        """Optimizer, schedule and scaler exactly as native `train()` builds them for `max_steps` updates."""
        self._planned_max_steps = max_steps
        warmup = self.config.warmup_steps or int(max_steps * self.config.warmup_ratio)
        self.optimizer = self._create_optimizer()
        self.optimizer.register_step_pre_hook(self._refuse_non_finite_gradients)
        self.scheduler = get_scheduler(
            self.optimizer, self.config.scheduler_type, max_steps, warmup, self.config.num_cycles
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.global_step = 0
        self.epoch = 0
        self.model.train()
        self.processor.change_mode(is_training=True)
        self.apply_schedule_state()

    def backward(self, pairs: Sequence[Pair], micro_index: int) -> torch.Tensor:
        """One native micro-batch: collate (training mode), forward, loss / accumulation, backward."""
        with private_python_rng(self.python_rng):
            batch = self.train_collator(list(pairs))
        self._expected_rows = len(pairs)
        self._guard_active = self._queue_loss = True
        try:
            return self._backward_one(batch, micro_index, self.use_amp, self.amp_dtype, is_last_micro=True)
        finally:
            self._guard_active = self._queue_loss = False

    def step(self, micro_batches: int) -> dict[str, float]:
        """One native optimizer update over `micro_batches` accumulated micro-batches (non-finite gradients are
        refused by the optimizer pre-step hook, see `_refuse_non_finite_gradients`)."""
        if not any(p.grad is not None for p in self._trainable):
            raise TrainingNumericsError("optim_step found no gradients; run forward_backward first")
        self._renormalize_partial_accumulation(micro_batches)
        self._last_grad_norm = None  # set by native clipping inside _optimizer_step, read by the pre-step hook
        self._step_readings = None
        self._optimizer_step()
        self.global_step += 1
        readings = self._step_readings
        if readings is None:  # a trainer_factory's _optimizer_step that never ran optimizer.step's hooks
            readings = self._read_step_scalars()
        self._step_readings = None
        # native's _flush_delayed_counters would read the skip counter now: the hook read it (it is 0, or it raised)
        return {
            "step": self.global_step,
            "learning_rate": float(self.scheduler.get_last_lr()[0]),
            "grad_norm": readings["grad_norm"] if self._last_grad_norm is not None else 0.0,
            **{key: readings[key] for key in LOSS_COMPONENTS},
        }

    def evaluate_loss(self, pairs: Sequence[Pair]) -> dict[str, float]:
        """The native supervised loss of one batch in eval mode, without touching RNGs, modes or gradients."""
        saved = self.python_rng.getstate()
        with preserved_rng(self.device), self._eval_mode(), torch.no_grad():
            try:
                with private_python_rng(self.python_rng):
                    batch = self.eval_collator(list(pairs))
            finally:
                self.python_rng.setstate(saved)
            self._expected_rows = len(pairs)
            self._guard_active = True
            try:
                with torch.amp.autocast(device_type=self.device.type, enabled=self.use_amp, dtype=self.amp_dtype):
                    outputs = self.model(batch)
            finally:
                self._guard_active = False
        return {key: _scalar(outputs.get(key)) for key in LOSS_KEYS}

    def extract(
        self,
        texts: Sequence[str],
        schemas: Sequence[Mapping[str, Any]],
        *,
        threshold: float,
        batch_size: int,
        include_confidence: bool = False,
    ) -> list[dict[str, Any]]:
        """gliner2's own batched inference (``batch_extract``) on the live model: eval mode, no grad, no RNG drawn
        (its DataLoader draws a torch seed; collation may draw Python randomness), training modes restored."""
        from gliner2.inference.schema import Schema

        built = [Schema.from_dict(dict(schema)) for schema in schemas]
        saved = self.python_rng.getstate()
        with preserved_rng(self.device), self._eval_mode(), torch.no_grad():
            try:
                with private_python_rng(self.python_rng):
                    with torch.amp.autocast(device_type=self.device.type, enabled=self.use_amp, dtype=self.amp_dtype):
                        return unwrap(self.model).batch_extract(
                            list(texts),
                            built,
                            batch_size=batch_size,
                            threshold=threshold,
                            include_confidence=include_confidence,
                        )
            finally:
                self.python_rng.setstate(saved)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        was_training = self.model.training
        processor_training = getattr(self.processor, "is_training", True)
        self.model.eval()
        self.processor.change_mode(is_training=False)
        try:
            yield
        finally:
            self.model.train(was_training)
            self.processor.change_mode(is_training=processor_training)

    def detached_model_copy(self, state: Mapping[str, torch.Tensor] | None = None) -> Any:
        """A deep CPU copy of the live model without hooks or gradients, optionally with `state` loaded into it."""
        self._guard_handle.remove()
        for handle in self._finite_grad_hook_handles:
            handle.remove()
        try:
            duplicate = copy.deepcopy(self.model)
        finally:
            self._guard_handle = unwrap(self.model).register_forward_hook(self._guard_outputs)
            self._install_finite_grad_hooks()
        for parameter in duplicate.parameters():
            parameter.grad = None
        duplicate.to("cpu")
        duplicate.eval()
        if state is not None:
            names = set(duplicate.state_dict())
            unknown = sorted(set(state) - names)
            if unknown:
                raise ValueError(f"detached weights name parameters the model lacks: {unknown[:5]}")
            with torch.no_grad():
                live = duplicate.state_dict()
                for name, tensor in state.items():
                    live[name].copy_(tensor)
        return duplicate

    def close(self) -> None:
        self._guard_handle.remove()
        for handle in self._finite_grad_hook_handles:
            handle.remove()
        self._finite_grad_hook_handles = []


def _scalar(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu())
    return float(value)
