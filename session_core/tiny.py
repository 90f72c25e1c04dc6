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
the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

# The vocabulary and records live in tiny_data (torch-free); re-exported here beside the builders.
from prefect_gliner2.session_core.tiny_data import (
    GLINER2_SPECIAL_TOKENS,
    TINY_ENTITY_TYPES,
    TINY_SPECIAL_TOKENS,
    TINY_WORDS,
    tiny_records,
    tiny_vocab,
)
from prefect_gliner2.session_core.tiny_data import check_seed as _check_seed

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
#: Encoder families the tiny builders can make: BERT (absolute positions) and DeBERTa-v2 (relative attention).
TINY_ENCODERS: tuple[str, ...] = ("bert", "deberta-v2")

# ---------------------------------------------------------------------------
# RNG isolation
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _isolated_rng(seed: int) -> Iterator[None]:
    """Seed torch/random/numpy for the block, then restore every global stream.

    torch.random.fork_rng restores the CPU generator (and CUDA generators when
    CUDA is initialised); ``random`` and numpy are saved and restored by hand
    because nothing in the build should leak into callers' streams either way.
    """
    import numpy as np
    import torch

    py_state = random.getstate()
    np_state = np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % (2**32))
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _check_architecture(architecture: str) -> str:
    name = str(architecture).strip().lower()
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    return name


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def _sized_vocab(vocab_size: int | None) -> dict[str, int]:
    """:func:`tiny_vocab`, padded with never-produced ``[unused<i>]`` tokens up to ``vocab_size`` when given."""
    vocab = tiny_vocab()
    if vocab_size is None:
        return vocab
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be an int >= {len(vocab)} (the tiny vocabulary), got {vocab_size!r}")
    # "[unused7]" can never come out of the pre-tokenizer (it splits "[" and "]"), so the filler rows of the
    # embedding only add size, exactly like a real model's rare tokens.
    vocab.update({f"[unused{i}]": i for i in range(len(vocab), vocab_size)})
    return vocab


def _make_fast_tokenizer(vocab_size: int | None = None):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = _sized_vocab(vocab_size)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    # Splits on whitespace and on every punctuation character, as BERT does.
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    # Registered as added special tokens so "[P]", "[SEP_TEXT]"... are matched
    # whole before pre-tokenization (never split into "[", "p", "]").
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS + GLINER2_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        padding_side="right",
    )


def build_tiny_tokenizer(directory: str | os.PathLike[str], vocab_size: int | None = None) -> Path:
    """Write a fast WordLevel tokenizer over :func:`tiny_vocab` into ``directory``.

    Lowercasing normalizer, BERT pre-tokenizer (whitespace + punctuation),
    ``[CLS] $A [SEP]`` post-processor, specials ``[PAD]``(0) ``[UNK]`` ``[CLS]``
    ``[SEP]`` ``[MASK]`` plus gliner2's ``[SEP_STRUCT]``, ``[SEP_TEXT]``, ``[P]``,
    ``[C]``, ``[E]``, ``[R]``, ``[L]``, ``[EXAMPLE]``, ``[OUTPUT]``,
    ``[DESCRIPTION]``. Loadable offline with ``AutoTokenizer.from_pretrained``.
    ``vocab_size`` pads the vocabulary with unused tokens to that size (the real models' 128,100).
    Returns the directory.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    _make_fast_tokenizer(vocab_size).save_pretrained(str(path))
    return path


# Bumped whenever the builders' bytes change; cached tiny model directories carry it in their names.
# r2: span models get a pinned count head (save_tiny_model's pinned_count).
TINY_MODEL_REVISION = "r2"

# ---------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------


def _default_heads(hidden_size: int) -> int:
    heads = hidden_size // 16 if hidden_size <= 64 else hidden_size // 64
    heads = max(1, heads)
    while hidden_size % heads:
        heads -= 1
    return heads


def tiny_encoder_config(
    hidden_size: int = 32,
    num_layers: int = 1,
    *,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
    max_position_embeddings: int = 512,
    encoder: str = "bert",
    vocab_size: int | None = None,
    deberta_v3: bool = False,
):
    """A ``transformers`` encoder config sized to :func:`tiny_vocab` (no resize needed).

    ``encoder``: ``"bert"`` (``BertConfig``, absolute positions) or ``"deberta-v2"`` (``DebertaV2Config`` with
    relative position attention, the encoder family of the released GLiNER2 models). ``vocab_size`` pads the
    vocabulary (see :func:`build_tiny_tokenizer`); ``deberta_v3`` uses DeBERTa-v3-base's relative-attention settings
    (256 position buckets, shared attention keys, layer-normed relative embeddings, no absolute position bias).
    """
    from transformers import BertConfig, DebertaV2Config

    if hidden_size <= 0 or num_layers <= 0:
        raise ValueError("hidden_size and num_layers must be > 0")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if encoder not in TINY_ENCODERS:
        raise ValueError(f"encoder must be one of {TINY_ENCODERS}, got {encoder!r}")
    if deberta_v3 and encoder != "deberta-v2":
        raise ValueError(f"deberta_v3=True needs encoder='deberta-v2', got {encoder!r}")
    heads = num_heads or _default_heads(hidden_size)
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {heads}")
    common: dict[str, Any] = dict(
        vocab_size=len(_sized_vocab(vocab_size)),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        hidden_act="gelu",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.02,
        pad_token_id=0,
    )
    if encoder == "deberta-v2":
        # position_buckets is read by the model (getattr) but not declared by the config class: hence the dict
        deberta: dict[str, Any] = {
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "type_vocab_size": 0,
            "position_buckets": 32,
        }
        if deberta_v3:  # microsoft/deberta-v3-base's config.json
            deberta.update(
                position_buckets=256,
                max_relative_positions=-1,
                share_att_key=True,
                norm_rel_ebd="layer_norm",
                position_biased_input=False,
                layer_norm_eps=1e-7,
            )
        return DebertaV2Config(**common, **deberta)
    return BertConfig(**common, type_vocab_size=2)


def build_tiny_encoder_dir(
    directory: str | os.PathLike[str],
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 1,
    *,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
    encoder: str = "bert",
    vocab_size: int | None = None,
    deberta_v3: bool = False,
) -> Path:
    """Save a randomly initialised tiny encoder (``BertModel``, or ``DebertaV2Model`` with ``encoder="deberta-v2"``)
    plus the tiny tokenizer.

    ``directory`` then works as an encoder ``model_name`` for
    ``AutoModel``/``AutoTokenizer.from_pretrained`` (offline). Same seed and
    sizes -> byte-identical ``model.safetensors``. Returns the directory.
    """
    from transformers import AutoModel

    _check_seed(seed)
    config = tiny_encoder_config(
        hidden_size,
        num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        dropout=dropout,
        encoder=encoder,
        vocab_size=vocab_size,
        deberta_v3=deberta_v3,
    )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with _isolated_rng(seed):
        model = AutoModel.from_config(config)
    model.save_pretrained(str(path))
    build_tiny_tokenizer(path, vocab_size)
    return path


# ---------------------------------------------------------------------------
# Extractor models
# ---------------------------------------------------------------------------


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
    from gliner2.configuration import ExtractorConfig

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

    Layout (gliner2's own ``save_pretrained``): ``config.json`` (with
    ``"architecture"``), ``encoder_config/config.json``, ``model.safetensors``,
    ``tokenizer.json`` + ``tokenizer_config.json``.

    ``dropout`` sets the encoder's hidden/attention dropout and the boundary
    head's dropout. (The span head has a hard-coded 0.1 dropout in
    ``span_rep`` whatever the config says.) ``boundary_head`` overrides
    individual boundary settings on top of :func:`tiny_boundary_head`. ``encoder`` picks the encoder family
    (``"bert"`` or ``"deberta-v2"``, see :func:`tiny_encoder_config`); ``vocab_size`` and ``deberta_v3`` make
    the real shape (:data:`GLINER2_BASE_SIZE`).

    ``pinned_count`` gives a span model a pretrained-like count head (see :func:`pin_count_head`): gliner2 2.1.0
    trains no count loss for entity tasks, yet its inference extracts an entity label only when the count head
    predicts a count above zero. A released checkpoint's count head does; a random one predicts 0, and a trained
    tiny model then extracts nothing however good its span scores are. ``None`` keeps the random head. Boundary
    models decode without that head and are unaffected.

    Deterministic: same arguments -> byte-identical ``model.safetensors`` and
    ``config.json``. Global RNG state is left untouched. Returns the directory.
    """
    import gliner2

    arch = _check_architecture(architecture)
    _check_seed(seed)
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
    model_class = gliner2.BoundaryExtractor if arch == "boundary" else gliner2.SpanExtractor
    tokenizer = _make_fast_tokenizer(vocab_size)
    with _isolated_rng(seed):
        model = model_class(config, encoder_config=encoder_config, tokenizer=tokenizer)
    if arch == "span" and pinned_count is not None:
        pin_count_head(model, pinned_count)
    expected = len(_sized_vocab(vocab_size))
    if len(model.processor.tokenizer) != expected:  # pragma: no cover - guards a gliner2 change
        raise RuntimeError(
            f"gliner2 grew the tiny tokenizer from {expected} to {len(model.processor.tokenizer)} "
            "tokens; add the new special tokens to GLINER2_SPECIAL_TOKENS"
        )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    return path


def pin_count_head(model: Any, count: int = 1) -> None:
    """Make a span model's count head predict ``count`` for every input, as a pretrained head does for a present label.

    The head's final linear layer gets zero weights and a bias that is 1.0 at ``count`` and 0.0 elsewhere, so the
    argmax is ``count`` whatever the embedding. It stays an ordinary trainable layer: tasks that do train the count
    loss (relations, structures) move it from there. gliner2 itself is not patched.
    """
    import torch

    head = getattr(model, "count_pred", None)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no count_pred head (only span models have one)")
    final = head[-1]
    if not 0 <= count < final.out_features:
        raise ValueError(f"count must be in [0, {final.out_features}), got {count}")
    with torch.no_grad():
        final.weight.zero_()
        final.bias.zero_()
        final.bias[count] = 1.0


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
    from gliner2.auto import AutoExtractor

    def load(path: Path):
        with _isolated_rng(seed):  # loading builds then overwrites weights; keep callers' RNG intact
            return AutoExtractor.from_pretrained(str(path))

    if directory is not None:
        path = save_tiny_model(directory, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs)
        return load(path)
    with tempfile.TemporaryDirectory(prefix="tiny-gliner2-") as tmp:
        path = save_tiny_model(tmp, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs)
        return load(path)
