"""Splitting a text into tokens for the writers of tokenized formats: every span boundary becomes a token boundary,
so each span covers whole tokens (CoNLL tags, spaCy ``char_span`` with strict alignment)."""

from __future__ import annotations

import re
from collections.abc import Collection

__all__ = ["runs", "whitespace_tokens"]

_RUN = re.compile(r"\S+|\s+")


def runs(text: str, boundaries: Collection[int]) -> list[tuple[int, int, bool]]:
    """``(start, end, is_space)`` pieces covering ``text`` exactly: maximal runs of whitespace and of non-whitespace,
    cut again at every offset in ``boundaries``."""
    cuts = sorted(b for b in set(boundaries) if 0 < b < len(text))
    pieces: list[tuple[int, int, bool]] = []
    for match in _RUN.finditer(text):
        start, end = match.span()
        inner = [b for b in cuts if start < b < end]
        for a, b in zip([start, *inner], [*inner, end], strict=True):
            pieces.append((a, b, text[a].isspace()))
    return pieces


def whitespace_tokens(text: str, boundaries: Collection[int]) -> list[tuple[int, int]]:
    """The non-whitespace pieces of ``runs``: CoNLL tokens."""
    return [(start, end) for start, end, space in runs(text, boundaries) if not space]
