"""The training config of a command: its ``--config`` file, or the documented defaults (``TrainingConfig``'s,
which are the run form's) when none is given, with the precision chosen for the device when the config
names none: bf16 on a CUDA device with native bf16, fp32 everywhere else (CPU). The choice is explicit (the
config the run records says fp16=False and bf16 True or False) and told in the command's first line; the
explicit-precision rule of ``TrainingConfig`` itself is unchanged."""

from __future__ import annotations

from typing import Any

__all__ = ["choose_precision", "training_config"]


def choose_precision(device: str | None) -> tuple[bool, str]:
    """(bf16, why) for the device a run trains on (None: CUDA when available, as the worker picks)."""
    if device == "cpu":
        return False, "fp32, chosen for the cpu device"
    import torch

    if not torch.cuda.is_available():
        if device is None:
            return False, "fp32, chosen for the cpu (no CUDA device is available)"
        return False, f"fp32 (the worker will refuse --device {device}: CUDA is not available)"
    name = torch.cuda.get_device_name(torch.device(device or "cuda"))
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return True, f"bf16, chosen for {name} (native bf16)"
    return False, f"fp32, chosen for {name} (no native bf16)"


def training_config(config_path: str | None, device: str | None) -> tuple[Any, str | None]:
    """The TrainingConfig to plan with, and the line that says how its precision was chosen (None: the config
    file names it)."""
    from prefect_gliner2.session_core import TrainingConfig
    from prefect_gliner2.session_core.config import read_config_file

    data = read_config_file(config_path) if config_path is not None else {}
    if "fp16" in data or "bf16" in data:
        return TrainingConfig.from_dict(data), None
    bf16, why = choose_precision(device)
    config = TrainingConfig.from_dict({**data, "fp16": False, "bf16": bf16})
    if config_path is None:
        return config, f"no --config: training with the default settings, precision {why}"
    return config, f"--config {config_path} names no precision (fp16/bf16): precision {why}"
