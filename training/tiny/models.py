"""The tiny extractor models: real gliner2 span or boundary heads over the tiny encoder, saved as native models.

``save_tiny_model`` writes a directory ``AutoExtractor.from_pretrained`` loads offline; ``build_tiny_model`` loads
it as gliner2 would. Same arguments, byte-identical files; global RNG state is left untouched. gliner2 and torch
load inside the functions.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prefect_gliner2.training.tiny.data import check_seed
from prefect_gliner2.training.tiny.encoder import isolated_rng, tiny_encoder_config
from prefect_gliner2.training.tiny.tokenizer import make_fast_tokenizer, sized_vocab

__all__ = [
    "ARCHITECTURES",
    "BENCH_MODEL_SIZE",
    "GLINER2_BASE_SIZE",
    "TINY_MODEL_REVISION",
    "build_tiny_model",
    "pin_count_head",
    "save_tiny_model",
    "tiny_boundary_head",
]

ARCHITECTURES = ("span", "boundary")

#: Sizes for benchmarks: ``build_tiny_model(arch, **BENCH_MODEL_SIZE)``. Measured on
#: 2 CPU cores, forward+backward of a batch of 8 tiny records: span ~100 ms (6.0M
#: parameters), boundary ~65 ms (4.7M). The defaults (hidden 32, 1 layer) take
#: ~12 ms (span) / ~15 ms (boundary).
BENCH_MODEL_SIZE: Mapping[str, int] = MappingProxyType({"hidden_size": 256, "num_layers": 3})
#: The gliner2-base shape (a DeBERTa-v3-base encoder: hidden 768, 12 layers, 12 heads, the full 128,100-token
#: vocabulary; ~184M encoder parameters), randomly initialised and built offline:
#: ``build_tiny_model(arch, **GLINER2_BASE_SIZE)``. For real-size benchmarks (bench/realsize.py), never for tests.
GLINER2_BASE_SIZE: Mapping[str, Any] = MappingProxyType(
    {
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "intermediate_size": 3072,
        "vocab_size": 128_100,
        "encoder": "deberta-v2",
        "deberta_v3": True,
    }
)
# Bumped whenever the builders' bytes change; cached tiny model directories carry it in their names.
# r2: span models get a pinned count head (save_tiny_model's pinned_count).
TINY_MODEL_REVISION = "r2"


def _check_architecture(architecture: str) -> str:
    name = str(architecture).strip().lower()
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    return name


def tiny_boundary_head(hidden_size: int = 32, dropout: float = 0.0) -> dict[str, Any]:
    """Boundary-head settings scaled down to a tiny encoder.

    gliner2's defaults are 128 wide (``boundary_dim``, ``pair_dim``,
    ``record_dim``; ``content_dim`` 64); here they follow the hidden size,
    clamped to [32, 128] and rounded down to a multiple of 8 (``pair_dim``
    must divide by the 8 compat heads and the 4 candidate-attention heads).
    Only widths change; the structure (records, relations, candidate
    attention, count head, abstention) stays at gliner2's defaults so the
    tiny model exercises the same code paths as a real one.
    """
    width = min(128, max(32, (hidden_size // 8) * 8))
    return {
        "boundary_dim": width,
        "pair_dim": width,
        "record_dim": width,
        "content_dim": width,
        "dropout": dropout,
    }


def _extractor_config(
    architecture: str,
    *,
    hidden_size: int,
    dropout: float,
    max_width: int,
    boundary_head: Mapping[str, Any] | None,
):
    from gliner2 import ExtractorConfig

    common: dict[str, Any] = {
        "model_name": "prefect-gliner2/tiny-bert",  # never resolved: tokenizer and encoder config are passed in
        "architecture": architecture,
        "token_pooling": "first",
        "attn_implementation": "sdpa",
    }
    if architecture == "span":
        return ExtractorConfig(
            **common,
            span_head={"max_width": max_width, "dropout": dropout},
            counting_layer="count_lstm",
        )
    head = tiny_boundary_head(hidden_size, dropout)
    head.update(dict(boundary_head or {}))
    return ExtractorConfig(**common, boundary_head=head)


def save_tiny_model(
    directory: str | os.PathLike[str],
    architecture: str = "span",
    seed: int = 0,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
    max_width: int = 8,
    boundary_head: Mapping[str, Any] | None = None,
    encoder: str = "bert",
    vocab_size: int | None = None,
    deberta_v3: bool = False,
    pinned_count: int | None = 1,
) -> Path:
    """Write a native gliner2 model directory that ``AutoExtractor.from_pretrained`` loads offline.

    Layout (gliner2's own ``save_pretrained``): ``config.json`` (with ``"architecture"``),
    ``encoder_config/config.json``, ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json``.

    ``dropout`` sets the encoder's hidden/attention dropout and the boundary head's dropout. (The span head has a
    hard-coded 0.1 dropout in ``span_rep`` whatever the config says.) ``boundary_head`` overrides individual boundary
    settings on top of :func:`tiny_boundary_head`. ``encoder`` picks the encoder family (``"bert"`` or
    ``"deberta-v2"``, see :func:`tiny_encoder_config`); ``vocab_size`` and ``deberta_v3`` make the real shape
    (:data:`GLINER2_BASE_SIZE`).

    ``pinned_count`` gives a span model a pretrained-like count head (see :func:`pin_count_head`): gliner2 2.1.0
    trains no count loss for entity tasks, yet its inference extracts an entity label only when the count head
    predicts a count above zero. A released checkpoint's count head does; a random one predicts 0, and a trained
    tiny model then extracts nothing however good its span scores are. ``None`` keeps the random head. Boundary
    models decode without that head and are unaffected.

    Deterministic: same arguments -> byte-identical ``model.safetensors`` and ``config.json``. Global RNG state is
    left untouched. Returns the directory.
    """
    arch = _check_architecture(architecture)
    check_seed(seed)
    encoder_config = tiny_encoder_config(
        hidden_size,
        num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        dropout=dropout,
        encoder=encoder,
        vocab_size=vocab_size,
        deberta_v3=deberta_v3,
    )
    config = _extractor_config(
        arch,
        hidden_size=hidden_size,
        dropout=dropout,
        max_width=max_width,
        boundary_head=boundary_head,
    )
    path = Path(directory)
    _write_model(path, arch, seed, encoder_config, config, vocab_size=vocab_size, pinned_count=pinned_count)
    return path


def _write_model(
    path: Path,
    arch: str,
    seed: int,
    encoder_config: Any,
    config: Any,
    *,
    vocab_size: int | None,
    pinned_count: int | None,
) -> None:
    """Build the tiny extractor under `seed` (RNG isolated), pin its count head, and ``save_pretrained`` it."""
    import gliner2

    model_class = gliner2.BoundaryExtractor if arch == "boundary" else gliner2.SpanExtractor
    tokenizer = make_fast_tokenizer(vocab_size)
    with isolated_rng(seed):
        model = model_class(config, encoder_config=encoder_config, tokenizer=tokenizer)
    if arch == "span" and pinned_count is not None:
        pin_count_head(model, pinned_count)
    from prefect_gliner2.training.engine.native import tokenizer_of

    expected = len(sized_vocab(vocab_size))
    if len(tokenizer_of(model)) != expected:  # pragma: no cover - guards a gliner2 change
        raise RuntimeError(
            f"gliner2 grew the tiny tokenizer from {expected} to {len(tokenizer_of(model))} "
            "tokens; add the new special tokens to GLINER2_SPECIAL_TOKENS"
        )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))


def pin_count_head(model: Any, count: int = 1) -> None:
    """Make a span model's count head predict ``count`` for every input (``engine.native.pin_count_head``)."""
    from prefect_gliner2.training.engine.native import pin_count_head as pin

    pin(model, count)


def build_tiny_model(
    architecture: str = "span",
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 1,
    directory: str | os.PathLike[str] | None = None,
    **kwargs: Any,
):
    """Build a tiny model and load it exactly as ``gliner2.AutoExtractor.from_pretrained`` would.

    Saves with :func:`save_tiny_model` into ``directory`` (kept) or a
    temporary directory (deleted after loading), then returns
    ``AutoExtractor.from_pretrained(dir)``: a ``gliner2.SpanExtractor`` or
    ``gliner2.BoundaryExtractor``, fp32, on CPU and -- as gliner2 returns it --
    in *training* mode (``model.training`` is True; gliner2's extract methods
    call ``eval()`` themselves and do not switch back). ``kwargs`` go to
    :func:`save_tiny_model` (``dropout``, ``max_width``, ``boundary_head``,
    ``num_heads``, ``intermediate_size``, ``encoder``, ``vocab_size``, ``deberta_v3``, ``pinned_count``).

    Note: a model loaded from a temporary directory has ``name_or_path``
    pointing at a directory that no longer exists; pass ``directory`` when
    that matters (e.g. PEFT adapters record it).
    """
    from prefect_gliner2.training.extractor_loading import load_extractor

    def load(path: Path):
        with isolated_rng(seed):  # loading builds then overwrites weights; keep callers' RNG intact
            return load_extractor(str(path))

    if directory is not None:
        path = save_tiny_model(directory, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs)
        return load(path)
    with tempfile.TemporaryDirectory(prefix="tiny-gliner2-") as tmp:
        path = save_tiny_model(tmp, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs)
        return load(path)
