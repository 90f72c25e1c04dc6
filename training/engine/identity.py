"""What makes two models the same for checkpoint continuation: architecture, config, topology, sampling."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import torch

from prefect_gliner2.training.engine import unwrap
from prefect_gliner2.training.state import canonical_name

_VOLATILE_CONFIG_KEYS = {
    "_name_or_path",
    "name_or_path",
    "transformers_version",
    "architectures",
    "torch_dtype",
    "dtype",
}


def describe_model(model: torch.nn.Module, processor: Any) -> dict[str, Any]:
    """A JSON description of the model that load_state compares field by field."""
    base = unwrap(model)
    config = getattr(base, "config", None)
    config_dict = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    config_dict = {k: v for k, v in config_dict.items() if k not in _VOLATILE_CONFIG_KEYS}
    topology = [
        f"{canonical_name(n)}|{tuple(p.shape)}|{p.dtype}|{int(p.requires_grad)}" for n, p in model.named_parameters()
    ]
    sampling = getattr(processor, "sampling_config", None)
    tokenizer = getattr(processor, "tokenizer", None)
    return {
        "architecture": str(getattr(base, "architecture", "span")),
        "model_class": type(base).__name__,
        "model_config_sha256": _sha(config_dict),
        "topology_sha256": _sha(sorted(topology)),
        "sampling": dataclasses.asdict(sampling)
        if dataclasses.is_dataclass(sampling) and not isinstance(sampling, type)
        else repr(sampling),
        "tokenizer_size": len(tokenizer) if tokenizer is not None else None,
    }


def model_differences(saved: dict[str, Any], here: dict[str, Any]) -> list[str]:
    labels = {
        "architecture": "architecture",
        "model_class": "model class",
        "model_config_sha256": "model configuration",
        "topology_sha256": "parameter topology (names/shapes/dtypes/trainable)",
        "sampling": "processor sampling configuration",
        "tokenizer_size": "tokenizer size",
    }
    return [
        f"{label}: checkpoint {_short(saved.get(key))} != session {_short(here.get(key))}"
        for key, label in labels.items()
        if _canon(saved.get(key)) != _canon(here.get(key))
    ]


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(value: Any) -> str:
    text = _canon(value)
    return text[:16] if isinstance(value, str) and len(value) == 64 else text[:200]
