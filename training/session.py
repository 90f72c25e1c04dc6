"""TrainingSession: bounded, serialized operations over gliner2's native trainer, with exact checkpoints.

    session = TrainingSession(model, config, max_steps=plan.max_steps)
    for i in range(plan.batch_count):
        session.forward_backward(plan.batch(i))
        if plan.is_update(i):
            session.optim_step()
    session.save_state("/runs/a/ckpt-000012")

Writing and restoring the checkpoint payload lives in ``session_checkpoint`` (a mixin of TrainingSession).
One process owns one session: gliner2's preprocessing and Torch's RNGs are process-global, so every operation
takes the session lock and runs to completion in order. A failed forward_backward or optim_step leaves the
session unusable (its RNG streams and gradients no longer match any plan); continue with a fresh session and
`load_state` from the last checkpoint.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from prefect_gliner2.session_core.checkpoint import open_checkpoint, write_checkpoint
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError, SessionStateError
from prefect_gliner2.session_core.pairs import to_pairs
from prefect_gliner2.training import engine as engine_mod
from prefect_gliner2.training.engine.identity import describe_model
from prefect_gliner2.training.session_checkpoint import SessionCheckpointing
from prefect_gliner2.training.state import base_weights, weights_digest
from prefect_gliner2.training.weights import export_weights, load_weights

logger = logging.getLogger(__name__)
EngineFactory = Callable[..., engine_mod.SessionEngine]


class TrainingSession(SessionCheckpointing):
    """One model, one optimizer, one schedule; operations as in the module docstring."""

    def __init__(
        self,
        model: Any,
        config: TrainingConfig | Mapping[str, Any],
        max_steps: int | None = None,
        *,
        device: str | None = None,
        trainer_factory: Any = None,
    ) -> None:
        self.config = config if isinstance(config, TrainingConfig) else TrainingConfig.from_dict(dict(config))
        self.max_steps = _resolve_max_steps(self.config, max_steps)
        self._lock = threading.RLock()
        self._device = engine_mod.resolve_device(device, bool(self.config.bf16))
        engine_mod.configure_determinism(self._device, bool(self.config.bf16))
        native = engine_mod.native_config(self.config.to_native_kwargs(), self._device)
        factory = _engine_factory(trainer_factory)
        self._engine = factory(
            model, native, device=self._device, gradient_checkpointing=bool(self.config.gradient_checkpointing)
        )
        if not isinstance(self._engine, engine_mod.SessionEngine):
            raise ConfigError(
                "trainer_factory must return a prefect_gliner2.training.engine.SessionEngine (or subclass)"
            )
        engine_mod.configure_sampling(
            self._engine.processor,
            shuffle_entities=self.config.shuffle_entity_labels,
            synthetic_entity_label_prob=self.config.synthetic_entity_label_prob,
        )
        self._engine.prepare(self.max_steps)
        self._identity = describe_model(self._engine.model, self._engine.processor)
        self.provenance: dict[str, Any] = {"base_model_hash": self._base_hash(), "loaded_weights": None}
        self._pending = 0
        self._micro_batches = 0
        self._samples = 0
        self._fresh = True
        self._failed: str | None = None
        self._closed = False

    # ---- read-only views ----------------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The live model (a PEFT model for LoRA sessions). Do not modify it behind the session's back."""
        return self._engine.model

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def step(self) -> int:
        """Optimizer updates applied so far."""
        return int(self._engine.global_step)

    @property
    def pending_micro_batches(self) -> int:
        """Micro-batches accumulated since the last optim_step (0 at an update boundary)."""
        return self._pending

    @property
    def is_fresh(self) -> bool:
        """True until the first forward_backward, optim_step, load_state or load_weights."""
        return self._fresh

    @property
    def samples_seen(self) -> int:
        return self._samples

    @property
    def architecture(self) -> str:
        return str(self._identity["architecture"])

    @property
    def is_lora(self) -> bool:
        return bool(self.config.use_lora)

    @property
    def engine(self) -> engine_mod.SessionEngine:
        return self._engine

    # ---- operations -----------------------------------------------------------------------------------------

    def forward(self, batch: Any, *, return_components: bool = False) -> Any:
        """Native eval-mode loss of a batch: no grad, no RNG draw, training mode and gradients untouched."""
        with self._lock:
            self._check_usable()
            losses = self._engine.evaluate_loss(to_pairs(batch))
            return losses if return_components else losses["total_loss"]

    def extract(
        self,
        texts: Sequence[str],
        schemas: Sequence[Mapping[str, Any]],
        *,
        threshold: float = 0.5,
        batch_size: int = 8,
        include_confidence: bool = False,
    ) -> list[dict[str, Any]]:
        """gliner2's formatted extractions of `texts` (one ``Schema.from_dict`` schema each) from the live model; like
        `forward`, it draws no RNG and leaves modes and gradients as they were."""
        with self._lock:
            self._check_usable()
            return self._engine.extract(
                texts, schemas, threshold=threshold, batch_size=batch_size, include_confidence=include_confidence
            )

    def forward_backward(self, batch: Any) -> float:
        """Accumulate one micro-batch's gradients; returns the native scalar batch loss (before accumulation)."""
        with self._lock:
            self._accumulate(batch)
            try:
                return self._engine.last_loss()
            except BaseException as exc:
                self._fail(f"forward_backward failed: {type(exc).__name__}: {exc}")
                raise

    def queue_forward_backward(self, batch: Any) -> None:
        """`forward_backward` without reading its loss back to the host: the loss stays on the device (an
        accelerator keeps running while the host prepares the next batch). The next `optim_step` checks every queued
        loss before it applies anything, and `take_losses` returns their values; a non-finite one raises there."""
        with self._lock:
            self._accumulate(batch)

    def take_losses(self) -> list[float]:
        """The losses of the micro-batches accumulated since the last call, in order (read from the device if
        `optim_step` has not read them yet); a non-finite one raises `TrainingNumericsError`."""
        with self._lock:
            self._check_usable()
            try:
                return self._engine.take_losses()
            except BaseException as exc:
                self._fail(f"take_losses failed: {type(exc).__name__}: {exc}")
                raise

    def _accumulate(self, batch: Any) -> None:
        self._check_usable()
        if self.step >= self.max_steps:
            raise SessionStateError(f"the session already applied its {self.max_steps} planned update(s)")
        pairs = to_pairs(batch)
        self._fresh = False
        try:
            self._engine.backward(pairs, self._pending)
        except BaseException as exc:
            self._fail(f"forward_backward failed: {type(exc).__name__}: {exc}")
            raise
        self._pending += 1
        self._micro_batches += 1
        self._samples += len(pairs)

    def optim_step(self) -> dict[str, float]:
        """Apply one update over the pending micro-batches (a partial window is renormalised natively)."""
        with self._lock:
            self._check_usable()
            if self._pending == 0:
                raise SessionStateError("optim_step with no pending micro-batches; call forward_backward first")
            if self.step >= self.max_steps:
                raise SessionStateError(f"optim_step refused: all {self.max_steps} planned update(s) were applied")
            try:
                metrics = self._engine.step(self._pending)
            except BaseException as exc:
                self._fail(f"optim_step failed: {type(exc).__name__}: {exc}")
                raise
            metrics["micro_batches"] = float(self._pending)
            self._pending = 0
            return metrics

    def save_state(self, uri: str, *, before_commit: Callable[[], None] | None = None) -> str:
        """Write a complete, immutable checkpoint to `uri` (fsspec URL or local path); returns its index hash.

        `before_commit` runs when the files are written, just before the commit (see ``write_checkpoint``)."""
        with self._lock:
            self._check_usable()
            files, meta = self.state_payload()
            return write_checkpoint(uri, files, meta, before_commit=before_commit)

    def load_state(self, uri: str) -> dict[str, Any]:
        """Restore everything from a checkpoint into this fresh session; returns the checkpoint's meta."""
        with self._lock:
            self._check_usable()
            if not self._fresh:
                raise SessionStateError(
                    "load_state needs a fresh session (no forward_backward, optim_step or load yet)"
                )
            checkpoint = open_checkpoint(uri, read_once=True)  # its bytes end in the tensors: no cached copy kept
            self.restore_payload(checkpoint)
            return checkpoint.meta

    def load_weights(self, uri: str) -> dict[str, Any]:
        """Start a new run from weights (native dir, PEFT adapter dir or session checkpoint); optimizer stays fresh."""
        with self._lock:
            self._check_usable()
            if not self._fresh:
                raise SessionStateError(
                    "load_weights needs a fresh session: it starts a new run from the given weights"
                )
            report = load_weights(self, uri)
            self._fresh = False
            self.provenance["loaded_weights"] = report
            return report

    def export_weights(
        self, uri: str, *, merged: bool = False, before_commit: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Write a native model directory (plus adapter / merged model for LoRA); live weights are untouched.

        `before_commit` runs when the files are written, just before they are committed."""
        with self._lock:
            self._check_usable()
            return export_weights(self, uri, merged=merged, before_commit=before_commit)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._engine.close()
            self._engine.model = None
            self._engine.optimizer = None
            gc.collect()
            if self._device.type == "cuda":
                torch.cuda.empty_cache()

    def __enter__(self) -> TrainingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- checkpoint payload and restore: state_payload, restore_payload (in SessionCheckpointing) ------------

    def _base_hash(self) -> str:
        return weights_digest(base_weights(self._engine.model))

    # ---- state machine -------------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise SessionStateError("the session is closed")
        if self._failed:
            raise SessionStateError(
                f"the session is unusable after an earlier failure ({self._failed}); create a fresh session and "
                "load_state from the last checkpoint"
            )

    def _fail(self, reason: str) -> None:
        self._failed = reason
        logger.error("training session failed: %s", reason)


def _resolve_max_steps(config: TrainingConfig, max_steps: int | None) -> int:
    steps = max_steps if max_steps is not None else (config.max_steps if config.max_steps > 0 else None)
    if steps is None:
        raise ConfigError("TrainingSession needs max_steps (pass max_steps=plan.max_steps, or set config.max_steps)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"max_steps must be a positive int, got {steps!r}")
    return steps


def _engine_factory(trainer_factory: Any) -> EngineFactory:
    """Our engine, a subclass of it, or a native ExtractorTrainer subclass composed under our engine."""
    if trainer_factory is None:
        return engine_mod.SessionEngine
    if isinstance(trainer_factory, type):
        if issubclass(trainer_factory, engine_mod.SessionEngine):
            return trainer_factory
        if issubclass(trainer_factory, engine_mod.ExtractorTrainer):
            return type(f"Session{trainer_factory.__name__}", (engine_mod.SessionEngine, trainer_factory), {})
        raise ConfigError(f"trainer_factory {trainer_factory!r} is not a subclass of gliner2's ExtractorTrainer")
    if callable(trainer_factory):
        return trainer_factory
    raise ConfigError(f"trainer_factory must be a class or callable, got {type(trainer_factory).__name__}")
