"""PEFT/LoRA adapters on gliner2 models: unwrapping, adapter parameters, and checking an adapter against the config.

Touches one gliner2 internal: ``gliner2.training.lora._resolve_targets`` (gliner2's own resolution of the
configured target groups to module paths), so the resolved targets compared are exactly the ones gliner2 injects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from gliner2.training.trainer import TrainingConfig as NativeTrainingConfig

from prefect_gliner2.session_core.errors import AdapterMismatchError

__all__ = [
    "expected_targets",
    "is_adapter_parameter",
    "is_peft",
    "unwrap",
    "validate_adapter",
    "validate_adapter_config",
]


def unwrap(model: torch.nn.Module) -> Any:
    """The gliner2 extractor inside a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_peft(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def is_adapter_parameter(name: str) -> bool:
    """True for parameters of the single default PEFT adapter (LoRA A/B, DoRA magnitude)."""
    return ".default" in name and any(part in name for part in ("lora_A", "lora_B", "lora_magnitude_vector"))


def validate_adapter(model: torch.nn.Module, config: NativeTrainingConfig) -> None:
    """A preloaded adapter must be the single default LoRA adapter with exactly the configured settings."""
    peft_config = getattr(model, "peft_config", {})
    names = sorted(peft_config)
    if names != ["default"]:
        raise AdapterMismatchError(
            f"expected exactly one adapter named 'default', found {names}; merge or drop the others"
        )
    adapter = peft_config["default"]
    if getattr(adapter, "inference_mode", False):
        raise AdapterMismatchError(
            "the preloaded adapter is in inference mode (frozen); load it with "
            "PeftModel.from_pretrained(base, path, is_trainable=True)"
        )
    settings = {
        k: getattr(adapter, k, None) for k in ("r", "lora_alpha", "lora_dropout", "use_dora", "bias", "target_modules")
    }
    _raise_adapter_diffs(model, config, settings, "the preloaded adapter")


def validate_adapter_config(
    model: torch.nn.Module, config: NativeTrainingConfig, settings: dict[str, Any], source: str
) -> None:
    """An adapter directory's adapter_config.json must declare exactly the session's LoRA settings."""
    if str(settings.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterMismatchError(
            f"{source} is a {settings.get('peft_type')} adapter; only LoRA adapters are supported"
        )
    _raise_adapter_diffs(model, config, settings, f"the adapter in {source}")


def _raise_adapter_diffs(
    model: torch.nn.Module, config: NativeTrainingConfig, settings: dict[str, Any], what: str
) -> None:
    targets = settings.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    checks = [
        ("lora_r", settings.get("r"), config.lora_r),
        ("lora_alpha", _num(settings.get("lora_alpha")), float(config.lora_alpha)),
        ("lora_dropout", _num(settings.get("lora_dropout")), float(config.lora_dropout)),
        ("lora_use_dora", bool(settings.get("use_dora")), bool(config.lora_use_dora)),
        ("bias", settings.get("bias", "none"), "none"),
        ("resolved targets", targets, expected_targets(model, config)),
    ]
    diffs = [f"{name}: adapter has {have!r}, config asks {want!r}" for name, have, want in checks if have != want]
    if diffs:
        raise AdapterMismatchError(
            f"{what} does not match the configuration: "
            + "; ".join(diffs)
            + ". Set the TrainingConfig LoRA fields to the adapter's values, "
            "or start fresh adapters from the base model"
        )


def expected_targets(model: torch.nn.Module, config: NativeTrainingConfig) -> list[str]:
    """gliner2's resolved LoRA target paths for the configured groups, on a plain or PEFT-injected model."""
    from gliner2.training.lora import _resolve_targets

    return sorted(_resolve_targets(_PlainView(unwrap(model)), list(config.lora_target_modules)))


class _PlainView:
    """A PEFT-injected model's modules as the plain model had them, for gliner2's own target resolution."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def named_modules(self) -> Iterator[tuple[str, torch.nn.Module]]:
        from peft.tuners.lora.layer import LoraLayer

        for name, module in self._model.named_modules():
            if ".lora_" in name or name.endswith(".base_layer") or ".base_layer." in name:
                continue
            yield name, (module.get_base_layer() if isinstance(module, LoraLayer) else module)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None
