"""Tiny, offline, deterministic GLiNER2 models and data for tests, benchmarks and demos.

Everything here is built in code: a WordLevel tokenizer over a fixed vocabulary
(:data:`TINY_WORDS`), a small BERT encoder, and the real gliner2 span or
boundary heads on top. Nothing touches the network, so the builders work with
``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``.

    save_tiny_model(dir, "span", seed=0)      -> native gliner2 model directory
    build_tiny_model("boundary", seed=0)      -> the object AutoExtractor.from_pretrained returns
    tiny_records(16, seed=0)                  -> native training records
    build_tiny_tokenizer(dir)                 -> fast tokenizer directory
    build_tiny_encoder_dir(dir, seed=0)       -> BERT encoder directory (config, weights, tokenizer)

Determinism: the same arguments give byte-identical files (``model.safetensors``,
``config.json``, tokenizer files), across processes and hash seeds. Building seeds torch locally and restores every
global RNG it could touch (torch CPU/CUDA, ``random``, numpy), so callers' RNG streams are unchanged.

Heavy modules (torch, transformers, tokenizers, gliner2) are imported inside
the functions, so importing this package costs nothing.

    data.py       the fixed vocabulary and seeded native records (torch-free)
    tokenizer.py  the WordLevel tokenizer over that vocabulary
    encoder.py    BERT / DeBERTa-v2 encoder configs and directories; RNG isolation while building
    models.py     span and boundary extractor models, saved and loaded as gliner2 does
"""

from __future__ import annotations

from prefect_gliner2.training.tiny.data import (
    GLINER2_SPECIAL_TOKENS,
    TINY_ENTITY_TYPES,
    TINY_SPECIAL_TOKENS,
    TINY_WORDS,
    tiny_records,
    tiny_vocab,
)
from prefect_gliner2.training.tiny.encoder import TINY_ENCODERS, build_tiny_encoder_dir, tiny_encoder_config
from prefect_gliner2.training.tiny.models import (
    BENCH_MODEL_SIZE,
    GLINER2_BASE_SIZE,
    TINY_MODEL_REVISION,
    build_tiny_model,
    pin_count_head,
    save_tiny_model,
    tiny_boundary_head,
)
from prefect_gliner2.training.tiny.tokenizer import build_tiny_tokenizer

__all__ = [
    "BENCH_MODEL_SIZE",
    "GLINER2_BASE_SIZE",
    "TINY_MODEL_REVISION",
    "TINY_ENCODERS",
    "GLINER2_SPECIAL_TOKENS",
    "TINY_ENTITY_TYPES",
    "TINY_SPECIAL_TOKENS",
    "TINY_WORDS",
    "build_tiny_encoder_dir",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "pin_count_head",
    "save_tiny_model",
    "tiny_boundary_head",
    "tiny_encoder_config",
    "tiny_records",
    "tiny_vocab",
]
