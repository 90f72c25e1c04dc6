"""A session's checkpoint: its continuation state as checkpoint files, the compatibility check, and the restore.

``state_payload`` turns weights, optimizer, schedule, scaler, pending gradients, counters and every RNG stream into
named files plus the index meta (streamed tensor writers, or detached host copies for a background write);
``restore_payload`` checks a checkpoint against this session (training config, model, device type, dtype, thread
count, trainer) and restores everything, RNGs last. Part of ``TrainingSession`` (a mixin over its fields).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import Checkpoint, Payload
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import CheckpointError, SessionCoreError, StateMismatchError
from prefect_gliner2.training.engine import FORMER_TRAINER_NAMES, SessionEngine
from prefect_gliner2.training.engine.identity import model_differences
from prefect_gliner2.training.prefetch import PREFETCHED_FILES, prefetch_state
from prefect_gliner2.training.state import (
    bytes_to_object,
    capture_grads,
    capture_rng,
    flatten_state,
    object_to_bytes,
    read_tensors,
    restore_grads,
    restore_rng,
    same_base_weights,
    unflatten_state,
    write_tensors,
)

__all__ = ["PREFETCHED_FILES", "SESSION_KIND", "SessionCheckpointing", "prefetch_state", "tensor_file"]

SESSION_KIND = "session"


def tensor_file(checkpoint: Checkpoint, name: str) -> dict[str, torch.Tensor]:
    """A (verified) tensor file of `checkpoint` as new tensors: the background read when one was prefetched."""
    job = checkpoint.prefetched(name)
    if job is not None:
        return dict(job.result())
    with checkpoint.open(name) as reader:
        return read_tensors(reader)


class SessionCheckpointing:
    """Checkpoint payload and restore over a TrainingSession's fields (see the module docstring)."""

    config: TrainingConfig
    max_steps: int
    provenance: dict[str, Any]
    _engine: SessionEngine
    _device: torch.device
    _identity: dict[str, Any]
    _pending: int
    _micro_batches: int
    _samples: int
    _fresh: bool

    if TYPE_CHECKING:  # defined by TrainingSession

        @property
        def step(self) -> int: ...

        @property
        def is_lora(self) -> bool: ...

        def _fail(self, reason: str) -> None: ...

    def state_payload(self, *, snapshot: bool = False) -> tuple[dict[str, Payload], dict[str, Any]]:
        """All continuation state as checkpoint files plus the index meta.

        Tensor files are streaming writers over the live tensors (call `write_checkpoint` before the next
        operation), or with ``snapshot=True`` over detached host copies taken now (one checkpoint's size of extra
        host RAM): those may be written from another thread while training continues."""
        engine = self._engine
        if engine._queued_losses:  # a non-finite queued loss raises here: its zeroed gradients are never saved
            try:
                engine._read_queued()
            except BaseException as exc:
                self._fail(f"save_state failed: {type(exc).__name__}: {exc}")
                raise
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
        rng = tensor_file(checkpoint, layout.RNG_FILE)
        grads = tensor_file(checkpoint, layout.GRADIENTS_FILE)
        skeleton = bytes_to_object(checkpoint.require(layout.OPTIMIZER_FILE), layout.OPTIMIZER_FILE)
        optimizer_state = unflatten_state(
            skeleton, tensor_file(checkpoint, layout.OPTIMIZER_TENSORS_FILE), layout.OPTIMIZER_FILE
        )
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
        saved, here = dict(checkpoint.meta.get("compat", {})), self._compat()
        if saved.get("trainer") in FORMER_TRAINER_NAMES and here["trainer"] == _current_trainer_name():
            saved["trainer"] = here["trainer"]  # the same trainer under the name an earlier layout gave it
        diffs = [
            f"{k}: checkpoint {saved.get(k)!r} != session {here[k]!r}"
            for k in ("max_steps", "device_type", "dtype", "cpu_threads", "trainer")
            if saved.get(k) != here[k]
        ]
        if not same_base_weights(saved.get("base_model_hash"), here["base_model_hash"], self._engine.model):
            diffs.append(
                f"base_model_hash: checkpoint {saved.get('base_model_hash')!r} != session {here['base_model_hash']!r}"
            )
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


def _current_trainer_name() -> str:
    return f"{SessionEngine.__module__}.{SessionEngine.__qualname__}"


def _host_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached host-memory copies (a CPU tensor is cloned, a device tensor copied to the host)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()}


def _tensor_writer(tensors: dict[str, torch.Tensor]) -> Payload:
    return lambda handle: write_tensors(handle, tensors)


def _python_state(rng: Any) -> list[Any]:
    version, key, gauss = rng.getstate()
    return [version, list(key), gauss]


def _dict_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if _jsonish(a.get(k)) != _jsonish(b.get(k))}


def _jsonish(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _versions() -> dict[str, str]:
    import gliner2

    return {"torch": torch.__version__, "gliner2": getattr(gliner2, "__version__", "?")}
