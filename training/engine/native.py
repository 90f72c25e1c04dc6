"""What the rest of the product uses of gliner2's models beyond their public API, in one place.

gliner2 2.1 internals touched here (and, for the trainer, in the other engine modules; nowhere else):

- ``model.count_pred``: a span model's count head (the number of instances it predicts per label). Read and pinned
  (``pin_count_head``: ``prefect-gliner2 init-model``, the pre-flight's repair, the tiny models) and listened to
  (``count_predictions``: the pre-flight's probe).
- ``gliner2.processing.word_splitter.word_splitter_from`` and ``gliner2.inference.chunking.split_text_into_chunks``:
  the word splitter and the chunking ``batch_extract_long`` uses (``word_splitter``, ``chunk_count``), so resumable
  extraction counts words and chunks exactly as gliner2 does.
- ``model.processor.tokenizer``: the tokenizer a model's processor uses (``tokenizer_of``), with gliner2's special
  tokens added (``prefect-gliner2 init-model`` and the tiny models check its size).
- ``model.encoder`` (a transformers model) and the ``[E]`` marker token: ``seed_entity_marker`` sets the marker's
  input embedding to the encoder's embedding of a word (``prefect-gliner2 init-model``).
- the name ``save_file`` bound inside loaded ``gliner2.*`` modules (``save_file_replaced``): ``save_pretrained``
  writes its weights through it, and the export writes them around the page cache with their digest
  (``training/native_save.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "chunk_count",
    "count_head",
    "count_predictions",
    "pin_count_head",
    "save_file_replaced",
    "seed_entity_marker",
    "tokenizer_of",
    "word_splitter",
]


def count_head(model: Any) -> Any | None:
    """A span model's count head (a module whose last layer is the linear count classifier); None for a model
    without one (boundary models)."""
    return getattr(model, "count_pred", None)


def pin_count_head(model: Any, count: int = 1) -> None:
    """Make a span model's count head predict ``count`` for every input, as a pretrained head does for a present label.

    The head's final linear layer gets zero weights and a bias that is 1.0 at ``count`` and 0.0 elsewhere, so the
    argmax is ``count`` whatever the embedding. It stays an ordinary trainable layer: tasks that do train the count
    loss (relations, structures) move it from there. gliner2 itself is not patched.
    """
    import torch

    head = count_head(model)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no count_pred head (only span models have one)")
    final = head[-1]
    if not 0 <= count < final.out_features:
        raise ValueError(f"count must be in [0, {final.out_features}), got {count}")
    with torch.no_grad():
        final.weight.zero_()
        final.bias.zero_()
        final.bias[count] = 1.0


ENTITY_MARKER = "[E]"


def seed_entity_marker(model: Any, word: str) -> list[int]:
    """Set the input embedding of gliner2's entity-label marker ``[E]`` to the encoder's embedding of `word` (the mean
    of its pieces' rows when the tokenizer splits it); the ids of those pieces are returned. Nothing else changes:
    the marker's row stays an ordinary trainable row of the encoder's embedding matrix."""
    import torch

    tokenizer = tokenizer_of(model)
    marker = tokenizer.convert_tokens_to_ids(ENTITY_MARKER)
    pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
    if marker == tokenizer.unk_token_id or not pieces or tokenizer.unk_token_id in pieces:
        raise ValueError(f"cannot seed {ENTITY_MARKER}: the tokenizer has no such token or cannot encode {word!r}")
    embeddings = model.encoder.get_input_embeddings().weight
    with torch.no_grad():
        embeddings[marker] = embeddings[pieces].mean(0)
    return list(pieces)


@contextmanager
def count_predictions(model: Any) -> Iterator[list[int] | None]:
    """Inside: every count the span model's head predicts is appended to the yielded list (a forward hook, nothing
    patched); None is yielded for a model without a count head."""
    head = count_head(model)
    if head is None:
        yield None
        return
    counts: list[int] = []

    def record(module: Any, inputs: Any, output: Any) -> None:
        counts.extend(int(c) for c in output.argmax(dim=-1).reshape(-1).tolist())

    hook = head.register_forward_hook(record)
    try:
        yield counts
    finally:
        hook.remove()


def tokenizer_of(model: Any) -> Any:
    """The tokenizer `model`'s processor encodes with (gliner2's special tokens included)."""
    return model.processor.tokenizer


def word_splitter(model: Any) -> Callable[..., Iterator[Any]]:
    """gliner2's word splitter for `model` (what its chunking counts words with): ``splitter(text, lower=False)``."""
    from gliner2.processing.word_splitter import word_splitter_from

    splitter: Callable[..., Iterator[Any]] = word_splitter_from(model)
    return splitter


def chunk_count(text: str, chunk_size: int, chunk_overlap: int, splitter: Callable[..., Any]) -> int:
    """How many chunks gliner2's ``batch_extract_long`` splits `text` into."""
    from gliner2.inference.chunking import split_text_into_chunks

    return len(split_text_into_chunks(text, chunk_size, chunk_overlap, splitter))


@contextmanager
def save_file_replaced(original: Callable[..., Any], replacement: Callable[..., Any]) -> Iterator[None]:
    """Inside: every loaded ``gliner2.*`` module's binding of `original` (safetensors' ``save_file``, which gliner2's
    ``save_pretrained`` calls) names `replacement` instead; always undone. Process-wide while active."""
    swapped = [
        (module, name)
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("gliner2.") and module is not None
        for name, value in list(vars(module).items())
        if value is original
    ]
    for module, name in swapped:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name in swapped:
            setattr(module, name, original)
