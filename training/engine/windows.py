"""gliner2's word splitting and long-text windows, for extraction that runs outside the torch model (the ONNX
runtime): the same words, windows and merge as gliner2's ``batch_extract_long``.

gliner2 2.1 internals touched here: ``gliner2.processing.word_splitter.WhitespaceTokenSplitter`` (the default
splitter of every span model the ONNX export covers), ``gliner2.inference.chunking.split_text_into_chunks`` and
``merge_chunk_results``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["merge_windows", "split_windows", "whitespace_splitter"]


def whitespace_splitter() -> Callable[..., Iterator[Any]]:
    """gliner2's whitespace word splitter: ``splitter(text, lower=False)`` yields (word, start, end)."""
    from gliner2.processing.word_splitter import WhitespaceTokenSplitter

    splitter: Callable[..., Iterator[Any]] = WhitespaceTokenSplitter()
    return splitter


def split_windows(text: str, size: int, overlap: int, splitter: Callable[..., Any]) -> list[Any]:
    """gliner2's overlapping word windows of `text` (each with ``text`` and its character offsets)."""
    from gliner2.inference.chunking import split_text_into_chunks

    windows: list[Any] = split_text_into_chunks(text, size, overlap, splitter)
    return windows


def merge_windows(text: str, windows: Sequence[Any], parts: Sequence[Any], *, details: bool) -> Any:
    """gliner2's merge of the windows' payloads (each with confidences and window offsets) into one for `text`;
    `details` keeps confidences and offsets in the result."""
    from gliner2.inference.chunking import merge_chunk_results

    return merge_chunk_results(text, list(windows), list(parts), include_confidence=details, include_spans=details)
