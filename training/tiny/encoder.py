"""The tiny encoder: a BERT or DeBERTa-v2 ``transformers`` config sized to the tiny vocabulary, saved offline.

Building seeds torch locally and restores every global RNG it could touch (``isolated_rng``), so callers' random
streams are unchanged and the same seed gives byte-identical weights. Heavy modules load inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect_gliner2.training.tiny.data import check_seed
from prefect_gliner2.training.tiny.tokenizer import build_tiny_tokenizer, sized_vocab

__all__ = ["TINY_ENCODERS", "build_tiny_encoder_dir", "isolated_rng", "tiny_encoder_config"]

#: Encoder families the tiny builders can make: BERT (absolute positions) and DeBERTa-v2 (relative attention).
TINY_ENCODERS: tuple[str, ...] = ("bert", "deberta-v2")


@contextlib.contextmanager
def isolated_rng(seed: int) -> Iterator[None]:
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

    _check_encoder_args(hidden_size, num_layers, dropout, encoder, deberta_v3)
    heads = num_heads or _default_heads(hidden_size)
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {heads}")
    common: dict[str, Any] = dict(
        vocab_size=len(sized_vocab(vocab_size)),
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
        return DebertaV2Config(**common, **_deberta_settings(deberta_v3))
    return BertConfig(**common, type_vocab_size=2)


def _check_encoder_args(hidden_size: int, num_layers: int, dropout: float, encoder: str, deberta_v3: bool) -> None:
    if hidden_size <= 0 or num_layers <= 0:
        raise ValueError("hidden_size and num_layers must be > 0")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if encoder not in TINY_ENCODERS:
        raise ValueError(f"encoder must be one of {TINY_ENCODERS}, got {encoder!r}")
    if deberta_v3 and encoder != "deberta-v2":
        raise ValueError(f"deberta_v3=True needs encoder='deberta-v2', got {encoder!r}")


def _deberta_settings(deberta_v3: bool) -> dict[str, Any]:
    """DeBERTa-v2 relative-attention settings; with `deberta_v3`, DeBERTa-v3-base's."""
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
    return deberta


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

    check_seed(seed)
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
    with isolated_rng(seed):
        model = AutoModel.from_config(config)
    model.save_pretrained(str(path))
    build_tiny_tokenizer(path, vocab_size)
    return path
