"""Model sources: a local model directory, a Hugging Face model id, or a built-in offline tiny model.

    "/models/my-gliner2"       a native gliner2 directory (config.json + model.safetensors, as save_pretrained writes)
    "fastino/gliner2-base-v1"  a Hugging Face model id (needs the hub, or its files in the local HF cache)
    "tiny:span"                a tiny offline span model (hidden 32, 1 layer, seed 0), built in code (and cached)
    "tiny:boundary:64x2"       a tiny boundary model with hidden size 64 and 2 layers
    "tiny:span:64x2:deberta"   the same sizes on a DeBERTa-v3-style encoder (relative attention; the demo's model)

``model_architecture`` answers "span or boundary?" without importing torch (the flow process plans with it);
``load_model`` builds the model in the worker process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.layout import MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE

__all__ = ["check_model_source", "load_model", "model_architecture", "parse_tiny", "tiny_model_dir"]

TINY_PREFIX = "tiny:"
CACHE_ENV = "PREFECT_GLINER2_CACHE"
_TINY = re.compile(r"^tiny:(span|boundary)(?::(\d+)x(\d+))?(?::(bert|deberta))?$")
# the encoder families a tiny source may name: BERT (absolute positions, the default) or a DeBERTa-v3-style encoder
# (relative attention: a label's meaning does not depend on its place in the prompt, as with gliner2's released models)
_TINY_ENCODERS: dict[str, tuple[str, bool]] = {"bert": ("bert", False), "deberta": ("deberta-v2", True)}
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_tiny(source: str) -> tuple[str, int, int, str] | None:
    """('span'|'boundary', hidden_size, num_layers, 'bert'|'deberta') for a 'tiny:...' source, None for anything
    else."""
    if not source.startswith(TINY_PREFIX):
        return None
    match = _TINY.match(source)
    if match is None:
        raise ConfigError(
            f"unknown built-in model {source!r}; use 'tiny:span', 'tiny:boundary' or e.g. 'tiny:span:64x2' "
            "(hidden size x layers) or 'tiny:span:64x2:deberta' (a DeBERTa-v3-style encoder)"
        )
    hidden, layers = int(match.group(2) or 32), int(match.group(3) or 1)
    if hidden < 8 or layers < 1:
        raise ConfigError(f"tiny model {source!r}: hidden size must be >= 8 and layers >= 1")
    return match.group(1), hidden, layers, match.group(4) or "bert"


def check_model_source(source: str) -> None:
    """Refuse a model argument that is neither a tiny model, an existing directory nor a Hugging Face id."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(
            "model must be a local model directory, a Hugging Face model id or 'tiny:span'/'tiny:boundary'"
        )
    if parse_tiny(source) is not None or os.path.isdir(os.path.expanduser(source)):
        return
    if os.path.exists(os.path.expanduser(source)) or source.startswith((".", "/", "~")) or not _HF_ID.match(source):
        raise ConfigError(
            f"model {source!r} is not a model directory (with config.json and model.safetensors), a Hugging Face id "
            "like 'owner/name', or a built-in 'tiny:span' / 'tiny:boundary'"
        )


def model_architecture(source: str) -> str:
    """'span' or 'boundary', read from the model's config.json (torch-free)."""
    check_model_source(source)
    tiny = parse_tiny(source)
    if tiny is not None:
        return tiny[0]
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        config_path = os.path.join(path, MODEL_CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise ConfigError(
                f"model directory {source!r} has no config.json; pass a directory written by save_pretrained"
            )
        with open(config_path, encoding="utf-8") as handle:
            return _architecture(json.load(handle), source)
    try:
        from huggingface_hub import hf_hub_download

        with open(hf_hub_download(source, MODEL_CONFIG_FILE), encoding="utf-8") as handle:
            return _architecture(json.load(handle), source)
    except Exception as exc:  # noqa: BLE001 - any hub failure means the same thing to the user
        raise ConfigError(
            f"cannot read config.json of Hugging Face model {source!r} ({type(exc).__name__}: {exc}); check the id "
            "and network access, or download the model and pass its local directory"
        ) from exc


def _architecture(config: Any, source: str) -> str:
    architecture = config.get("architecture", "span") if isinstance(config, dict) else None
    if architecture not in ("span", "boundary"):
        raise ConfigError(
            f"model {source!r} has architecture {architecture!r}; only 'span' and 'boundary' are supported"
        )
    return str(architecture)


def load_model(source: str) -> Any:
    """Load the model in the worker process (imports torch and gliner2)."""
    from prefect_gliner2.training.extractor_loading import load_extractor

    tiny = parse_tiny(source)
    path = tiny_model_dir(*tiny) if tiny is not None else os.path.expanduser(source)
    return load_extractor(str(path))


def tiny_model_dir(architecture: str, hidden: int, layers: int, encoder: str = "bert") -> str:
    """The built-in tiny model as a directory in $PREFECT_GLINER2_CACHE (default ~/.cache/prefect-gliner2), built
    once (deterministic bytes), so exported LoRA adapters name a base model directory that exists. The name carries
    the builders' revision: a directory built by an older revision (a random count head) is never reused."""
    from prefect_gliner2.training.tiny import TINY_MODEL_REVISION, save_tiny_model

    cache = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "prefect-gliner2")
    family = "" if encoder == "bert" else f"-{encoder}"
    path = os.path.join(cache, f"tiny-{architecture}-{hidden}x{layers}{family}-seed0-{TINY_MODEL_REVISION}")
    if not os.path.isfile(os.path.join(path, MODEL_WEIGHTS_FILE)):
        os.makedirs(cache, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".tiny-{architecture}-", dir=cache)
        family_name, deberta_v3 = _TINY_ENCODERS[encoder]
        save_tiny_model(
            staging,
            architecture,
            0,
            hidden_size=hidden,
            num_layers=layers,
            encoder=family_name,
            deberta_v3=deberta_v3,
        )
        try:
            os.rename(staging, path)
        except OSError:  # another process built it first (same bytes)
            shutil.rmtree(staging, ignore_errors=True)
    return path
