"""The tiny tokenizer: a fast WordLevel tokenizer over the tiny vocabulary, built in code (offline).

``transformers`` and ``tokenizers`` are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect_gliner2.training.tiny.data import GLINER2_SPECIAL_TOKENS, TINY_SPECIAL_TOKENS, tiny_vocab

__all__ = ["build_tiny_tokenizer", "make_fast_tokenizer", "sized_vocab"]


def sized_vocab(vocab_size: int | None) -> dict[str, int]:
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


def make_fast_tokenizer(vocab_size: int | None = None):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = sized_vocab(vocab_size)
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
    make_fast_tokenizer(vocab_size).save_pretrained(str(path))
    return path
