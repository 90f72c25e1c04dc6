"""TrainingSession: bounded, serialized operations over gliner2's native trainer, with exact checkpoints.

    session = TrainingSession(model, config, max_steps=plan.max_steps)
    for i in range(plan.batch_count):
        session.forward_backward(plan.batch(i))
        if plan.is_update(i):
            session.optim_step()
    session.save_state("/runs/a/ckpt-000012")

One process owns one session: gliner2's preprocessing and Torch's RNGs are process-global, so every operation
takes the session lock and runs to completion in order. A failed forward_backward or optim_step leaves the
session unusable (its RNG streams and gradients no longer match any plan); continue with a fresh session and
`load_state` from the last checkpoint.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from prefect_gliner2.session_core import engine as engine_mod
from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import Checkpoint, Payload, open_checkpoint, write_checkpoint
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import (
    CheckpointError,
    ConfigError,
    SessionCoreError,
    SessionStateError,
    StateMismatchError,
)
from prefect_gliner2.session_core.identity import describe_model, model_differences
from prefect_gliner2.session_core.pairs import to_pairs
from prefect_gliner2.session_core.state import (
    base_weights,
    bytes_to_object,
    capture_grads,
    capture_rng,
    flatten_state,
    object_to_bytes,
    read_tensors,
    restore_grads,
    restore_rng,
    tensors_digest,
    unflatten_state,
    write_tensors,
)

logger = logging.getLogger(__name__)

SESSION_KIND = "session"
EngineFactory = Callable[..., engine_mod.SessionEngine]


class TrainingSession:
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
                "trainer_factory must return a prefect_gliner2.session_core.engine.SessionEngine (or subclass)"
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
        self, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]], *, threshold: float = 0.5, batch_size: int = 8
    ) -> list[dict[str, Any]]:
        """gliner2's formatted extractions of `texts` (one ``Schema.from_dict`` schema each) from the live model; like
        `forward`, it draws no RNG and leaves modes and gradients as they were."""
        with self._lock:
            self._check_usable()
            return self._engine.extract(texts, schemas, threshold=threshold, batch_size=batch_size)

    def forward_backward(self, batch: Any) -> float:
        """Accumulate one micro-batch's gradients; returns the native scalar batch loss (before accumulation)."""
        with self._lock:
            self._check_usable()
            if self.step >= self.max_steps:
                raise SessionStateError(f"the session already applied its {self.max_steps} planned update(s)")
            pairs = to_pairs(batch)
            self._fresh = False
            try:
                loss = self._engine.backward(pairs, self._pending)
                value = float(loss)
            except BaseException as exc:
                self._fail(f"forward_backward failed: {type(exc).__name__}: {exc}")
                raise
            self._pending += 1
            self._micro_batches += 1
            self._samples += len(pairs)
            return value

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
            metrics.update(self._engine.last_losses())
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
            checkpoint = open_checkpoint(uri)
            self.restore_payload(checkpoint)
            return checkpoint.meta

    def load_weights(self, uri: str) -> dict[str, Any]:
        """Start a new run from weights (native dir, PEFT adapter dir or session checkpoint); optimizer stays fresh."""
        from prefect_gliner2.session_core.weights import load_weights

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
        from prefect_gliner2.session_core.weights import export_weights

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

    # ---- checkpoint payload (also used by the managed driver) ----------------------------------------------

    def state_payload(self, *, snapshot: bool = False) -> tuple[dict[str, Payload], dict[str, Any]]:
        """All continuation state as checkpoint files plus the index meta.

        Tensor files are streaming writers over the live tensors (call `write_checkpoint` before the next
        operation), or with ``snapshot=True`` over detached host copies taken now (one checkpoint's size of extra
        host RAM): those may be written from another thread while training continues."""
        engine = self._engine
        named = list(engine.model.named_parameters())
        weights = {n: p for n, p in named if p.requires_grad} if self.is_lora else dict(engine.model.state_dict())
        rng_meta, rng_tensors = capture_rng(self._device)
        grads = capture_grads(named)
        optimizer_skeleton, optimizer_tensors = flatten_state(engine.optimizer.state_dict(), "optimizer")
        state = {
            "counters": engine.counters(),
            "pending_micro_batches": self._pending,
            "micro_batches": self._micro_batches,
            "samples_seen": self._samples,
            "max_steps": self.max_steps,
            "schedule_state": engine.schedule_state(),
            "rng": rng_meta,
            "session_python_rng": _python_state(engine.python_rng),
            "pending_gradients": sorted(grads),
        }
        tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = _host_copies if snapshot else dict
        files: dict[str, Payload] = {
            layout.WEIGHTS_FILE: _tensor_writer(tensors(weights)),
            layout.GRADIENTS_FILE: _tensor_writer(tensors(grads)),
            layout.RNG_FILE: _tensor_writer(tensors(rng_tensors)),
            layout.OPTIMIZER_TENSORS_FILE: _tensor_writer(tensors(optimizer_tensors)),
            layout.OPTIMIZER_FILE: object_to_bytes(optimizer_skeleton),
            layout.SCHEDULER_FILE: object_to_bytes(engine.scheduler.state_dict()),
            layout.SCALER_FILE: object_to_bytes(engine.scaler.state_dict()),
            layout.SESSION_STATE_FILE: json.dumps(state, sort_keys=True).encode(),
        }
        hook = getattr(engine, "session_state_dict", None)
        if callable(hook):
            files[layout.TRAINER_EXTRA_FILE] = object_to_bytes(hook())
        meta = {
            "kind": SESSION_KIND,
            "config": self.config.to_dict(),
            "compat": self._compat(),
            "step": self.step,
            "pending_micro_batches": self._pending,
            "provenance": self.provenance,
            "versions": _versions(),
        }
        return files, meta

    def restore_payload(self, checkpoint: Checkpoint) -> None:
        """Check compatibility, then restore weights, optimizer, schedule, gradients, counters and RNGs (last).

        Every file is streamed once and verified in the same pass. All but the weights are read (and verified)
        before the session changes, so a damaged one leaves this session fresh; the weights are streamed straight
        into the live parameters last, so a damaged weights file leaves the session unusable (create a fresh one)."""
        self._check_compatible(checkpoint)
        engine = self._engine
        state = json.loads(checkpoint.require(layout.SESSION_STATE_FILE))
        scheduler_state = bytes_to_object(checkpoint.require(layout.SCHEDULER_FILE), layout.SCHEDULER_FILE)
        scaler_state = bytes_to_object(checkpoint.require(layout.SCALER_FILE), layout.SCALER_FILE)
        extra_state = (
            bytes_to_object(checkpoint.require(layout.TRAINER_EXTRA_FILE), layout.TRAINER_EXTRA_FILE)
            if checkpoint.has(layout.TRAINER_EXTRA_FILE)
            else None
        )
        hook = getattr(engine, "load_session_state_dict", None)
        if (extra_state is None) != (not callable(hook)):
            raise StateMismatchError(
                "the checkpoint's trainer recovery buffers and this session's trainer_factory do not match "
                f"(checkpoint has buffers: {extra_state is not None}; trainer loads them: {callable(hook)}); "
                "use the same trainer_factory that wrote the checkpoint"
            )
        with checkpoint.open(layout.RNG_FILE) as reader:
            rng = read_tensors(reader)
        with checkpoint.open(layout.GRADIENTS_FILE) as reader:
            grads = read_tensors(reader)
        skeleton = bytes_to_object(checkpoint.require(layout.OPTIMIZER_FILE), layout.OPTIMIZER_FILE)
        with checkpoint.open(layout.OPTIMIZER_TENSORS_FILE) as reader:
            optimizer_state = unflatten_state(skeleton, read_tensors(reader), layout.OPTIMIZER_FILE)
        self._fresh = False
        try:
            self._stream_weights(checkpoint)
            engine.optimizer.load_state_dict(optimizer_state)
            engine.scheduler.load_state_dict(scheduler_state)
            engine.scaler.load_state_dict(scaler_state)
            restore_grads(engine.model.named_parameters(), grads)
            engine.load_counters(state["counters"])
            engine.load_schedule_state(state["schedule_state"])
            self._pending = int(state["pending_micro_batches"])
            self._micro_batches = int(state["micro_batches"])
            self._samples = int(state["samples_seen"])
            self.provenance = dict(checkpoint.meta.get("provenance") or self.provenance)
            if extra_state is not None and callable(hook):
                hook(extra_state)
            restore_rng(state["rng"], rng, self._device)
            version, key, gauss = state["session_python_rng"]
            engine.python_rng.setstate((version, tuple(key), gauss))
        except SessionCoreError:
            self._fail("load_state failed part-way")
            raise
        except Exception as exc:
            self._fail("load_state failed part-way")
            raise CheckpointError(
                f"checkpoint {checkpoint.uri} could not be restored: {type(exc).__name__}: {exc}"
            ) from exc

    def _stream_weights(self, checkpoint: Checkpoint) -> None:
        """Weights straight from the file into the live tensors (CPU), or one tensor at a time via the host."""
        engine = self._engine
        if self.is_lora:
            target = {n: p.detach() for n, p in engine.model.named_parameters() if p.requires_grad}
        else:
            target = dict(engine.model.state_dict())

        def check(header: dict[str, Any]) -> None:
            missing, unexpected = sorted(set(target) - set(header)), sorted(set(header) - set(target))
            if missing or unexpected:
                raise StateMismatchError(
                    f"checkpoint weights do not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
            for name, (dtype, shape) in header.items():
                tensor = target[name]
                if tuple(shape) != tuple(tensor.shape) or dtype != tensor.dtype:
                    raise StateMismatchError(
                        f"{name}: checkpoint {tuple(shape)}/{dtype}, model {tuple(tensor.shape)}/{tensor.dtype}"
                    )

        def destination(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor | None:
            tensor = target[name]
            return tensor if tensor.device.type == "cpu" and tensor.is_contiguous() else None

        def sink(name: str, tensor: torch.Tensor) -> None:
            if tensor is not target[name]:
                with torch.no_grad():
                    target[name].copy_(tensor)

        with checkpoint.open(layout.WEIGHTS_FILE) as reader:
            read_tensors(reader, check=check, destination=destination, sink=sink)

    # ---- compatibility -------------------------------------------------------------------------------------

    def _compat(self) -> dict[str, Any]:
        return {
            "training": self.config.fingerprint_fields(),
            "max_steps": self.max_steps,
            "model": self._identity,
            "base_model_hash": self.provenance["base_model_hash"] if self.is_lora else None,
            "device_type": self._device.type,
            "dtype": "bf16" if self.config.bf16 else "fp32",
            "cpu_threads": torch.get_num_threads(),
            "trainer": f"{type(self._engine).__module__}.{type(self._engine).__qualname__}",
        }

    def _check_compatible(self, checkpoint: Checkpoint) -> None:
        if checkpoint.meta.get("kind") not in (SESSION_KIND, "managed"):
            raise CheckpointError(f"{checkpoint.uri} is not a training-session checkpoint")
        saved, here = checkpoint.meta.get("compat", {}), self._compat()
        diffs = [
            f"{k}: checkpoint {saved.get(k)!r} != session {here[k]!r}"
            for k in ("max_steps", "base_model_hash", "device_type", "dtype", "cpu_threads", "trainer")
            if saved.get(k) != here[k]
        ]
        diffs += [
            f"training config {k}: checkpoint {v[0]!r} != session {v[1]!r}"
            for k, v in _dict_diff(saved.get("training", {}), here["training"]).items()
        ]
        diffs += model_differences(saved.get("model", {}), here["model"])
        if diffs:
            raise StateMismatchError(
                "load_state needs the same training, model and sampling configuration, device type and thread count; "
                f"differences: {'; '.join(diffs[:8])}"
                + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else "")
                + ". Recreate the session exactly as the checkpoint's run did, or use load_weights to start a new run"
            )

    def _base_hash(self) -> str:
        return tensors_digest(base_weights(self._engine.model))

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


def _host_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached host-memory copies (a CPU tensor is cloned, a device tensor copied to the host)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()}


def _tensor_writer(tensors: dict[str, torch.Tensor]) -> Payload:
    return lambda handle: write_tensors(handle, tensors)


def _python_state(rng: Any) -> list[Any]:
    version, key, gauss = rng.getstate()
    return [version, list(key), gauss]


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


def _dict_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if _jsonish(a.get(k)) != _jsonish(b.get(k))}


def _jsonish(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _versions() -> dict[str, str]:
    import gliner2

    return {"torch": torch.__version__, "gliner2": getattr(gliner2, "__version__", "?")}
