"""Loading a gliner2 model directory through transformers' Auto classes, with gliner2's config type registered.

gliner2 saves ``config.json`` with ``model_type: "extractor"`` but does not register that type with transformers'
``AutoConfig``; ``AutoTokenizer.from_pretrained(model_dir)`` (inside gliner2's loading) then falls back to the base
``PreTrainedConfig`` and warns "You are using a model of type `extractor` to instantiate a model of type ``" on
every load. Registering the type (``AutoConfig.register``, transformers' public API) lets ``AutoConfig`` read the
file; the tokenizer loaded is the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_extractor", "register_extractor_config"]


def register_extractor_config() -> None:
    """Register gliner2's ``ExtractorConfig`` with transformers' ``AutoConfig`` (idempotent)."""
    from gliner2 import ExtractorConfig
    from transformers import AutoConfig

    AutoConfig.register(ExtractorConfig.model_type, ExtractorConfig, exist_ok=True)


def load_extractor(path: str, **kwargs: Any) -> Any:
    """``gliner2.AutoExtractor.from_pretrained(path, **kwargs)`` with the config type registered first."""
    from gliner2 import AutoExtractor

    register_extractor_config()
    return AutoExtractor.from_pretrained(path, **kwargs)
