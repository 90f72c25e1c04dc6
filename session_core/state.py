"""Serialising the pieces of training state: tensors, RNG streams, pending gradients, weights digests.

Only safetensors and `torch.load(weights_only=True)` are used to read anything back: no arbitrary pickles.
NumPy's RNG key is stored as a tensor so that the weights-only loader accepts it.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import random
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import safetensors.torch
import torch

from .errors import CheckpointError


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """safetensors bytes of independent, contiguous CPU copies (tied or shared storages are fine)."""
    return safetensors.torch.save({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()})


def bytes_to_tensors(data: bytes, what: str) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{what} is not a valid safetensors file ({exc})") from exc


def object_to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def bytes_to_object(data: bytes, what: str) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only; any other pickle is refused."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{what} could not be loaded with weights_only=True ({type(exc).__name__}: {str(exc)[:300]}); "
            "checkpoints may hold only tensors and plain containers, never arbitrary pickles"
        ) from exc


def capture_rng(device: torch.device) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Python, NumPy, Torch CPU and (when used) CUDA generator states as (JSON part, tensors)."""
    version, python_key, gauss = random.getstate()
    kind, numpy_key, pos, has_gauss, cached = cast(Any, np.random.get_state())
    meta = {
        "python": {"version": version, "key": list(python_key), "gauss": gauss},
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "cuda_devices": 0,
    }
    tensors = {"torch_cpu": torch.get_rng_state(), "numpy_key": torch.from_numpy(numpy_key.astype(np.int64))}
    if device.type == "cuda":
        states = torch.cuda.get_rng_state_all()
        meta["cuda_devices"] = len(states)
        tensors.update({f"cuda_{i}": state for i, state in enumerate(states)})
    return meta, tensors


def restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    python = meta["python"]
    random.setstate((python["version"], tuple(python["key"]), python["gauss"]))
    numpy = meta["numpy"]
    key = tensors["numpy_key"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], key, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(tensors["torch_cpu"])
    if device.type == "cuda":
        count = int(meta.get("cuda_devices", 0))
        if count != torch.cuda.device_count():
            raise CheckpointError(
                f"checkpoint holds RNG state for {count} CUDA device(s), this machine has {torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all([tensors[f"cuda_{i}"] for i in range(count)])


def capture_grads(named: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """Pending gradients of trainable parameters; a parameter whose grad is None is simply absent (not zero)."""
    return {name: p.grad for name, p in named if p.requires_grad and p.grad is not None}


def restore_grads(named: Iterable[tuple[str, torch.nn.Parameter]], grads: dict[str, torch.Tensor]) -> None:
    params = dict(named)
    unknown = sorted(set(grads) - set(params))
    if unknown:
        raise CheckpointError(f"checkpoint has gradients for parameters this model lacks: {unknown[:5]}")
    for name, parameter in params.items():
        grad = grads.get(name)
        if grad is None:
            parameter.grad = None
            continue
        if grad.shape != parameter.shape or grad.dtype != parameter.dtype:
            raise CheckpointError(
                f"pending gradient {name} is {tuple(grad.shape)}/{grad.dtype}, "
                f"parameter is {tuple(parameter.shape)}/{parameter.dtype}"
            )
        parameter.grad = grad.to(parameter.device).clone()


def canonical_name(name: str) -> str:
    """A parameter name as the plain gliner2 model spells it, with PEFT wrapping removed."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes, in name order: identifies weights bit-exactly."""
    digest = hashlib.sha256()
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{data.dtype}|{tuple(data.shape)}\n".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def base_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The base model's tensors (everything but LoRA adapter parameters), under canonical names."""
    out = []
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        out.append((canonical_name(name), tensor))
    return out
