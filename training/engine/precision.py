"""Device and precision for an exact session: the device check, process-wide determinism, the native config.

Touches no gliner2 internals: it builds gliner2's public ``TrainingConfig`` with explicit precision.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from gliner2.training.trainer import TrainingConfig as NativeTrainingConfig

from prefect_gliner2.session_core.errors import BF16_NEEDS_CUDA, ConfigError, PrecisionError

__all__ = ["configure_determinism", "native_config", "resolve_device"]


def resolve_device(requested: str | None, bf16: bool) -> torch.device:
    """Pick the session device and check that the requested precision is hardware-native there."""
    device = torch.device(requested) if requested else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type not in ("cpu", "cuda"):
        raise PrecisionError(f"device {device} is not supported; use 'cpu' or 'cuda'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PrecisionError("device 'cuda' was requested but CUDA is not available; pass device='cpu'")
    if bf16:
        if device.type != "cuda":
            raise PrecisionError(BF16_NEEDS_CUDA)
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            raise PrecisionError(
                f"bf16=True but {torch.cuda.get_device_name(device)} has no hardware-native bf16 "
                "(emulated bf16 is refused); pass bf16=False to train in fp32."
            )
    return device


def configure_determinism(device: torch.device, bf16: bool) -> None:
    """Process-wide numerics for exact training: no TF32 in fp32, deterministic CUDA kernels."""
    if not bf16:
        torch.set_float32_matmul_precision("highest")
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)


def native_config(kwargs: dict[str, Any], device: torch.device) -> NativeTrainingConfig:
    """Build the native config with explicit precision; fp32 always disables TF32."""
    values = dict(kwargs)
    values["fp16"] = False
    if not values.get("bf16"):
        values["allow_tf32"] = False
        values["float32_matmul_precision"] = "highest"
    values["num_workers"] = 0
    values["report_to_wandb"] = False
    # Checkpointing is enabled by the engine itself, non-reentrant (see SessionEngine._enable_checkpointing).
    values["gradient_checkpointing"] = False
    values["pin_memory"] = False
    if values.get("bf16") and device.type != "cuda":  # resolve_device already refused this; keep torch quiet
        raise PrecisionError("bf16 requires CUDA")
    try:
        return NativeTrainingConfig(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"gliner2 rejected the training configuration: {exc}") from exc
