"""CoNLL / BIO columns: one token per line with its tag in a column, sentences separated by blank lines.

Reading: columns are split on whitespace; the token is in ``token_column`` (default the first) and the tag in
``tag_column`` (default the last); a line whose first column is ``-DOCSTART-`` separates documents and is no
sentence; a line of only whitespace ends a sentence. A sentence's tokens are joined with single spaces into its
text, and every entity keeps its character offsets in that text. Tags follow ``scheme``: IOB1 (``I-`` opens an
entity unless it continues one of the same label; ``B-`` only separates two adjacent ones), IOB2 (every entity
opens with ``B-``), BIOES (``B``/``I``/``E`` and ``S`` for one token) or BILOU (``L`` last, ``U`` unit); ``auto``
reads ``E-``/``S-`` as BIOES, ``L-``/``U-`` as BILOU, an ``I-`` that opens an entity as IOB1, else IOB2. A tag
that breaks its scheme is a problem naming the line and the fix; nothing is repaired silently.

Writing: the text is split on whitespace (and at entity boundaries), one ``token<TAB>tag`` line each, a blank line
after each document; overlapping entities cannot be written (one tag per token).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from prefect_gliner2.session_core.errors import FormatError
from prefect_gliner2.session_core.formats.document import Document, Span
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import Problems, text_lines
from prefect_gliner2.session_core.formats.tokens import whitespace_tokens

__all__ = ["DOCSTART", "detect_scheme", "looks_like_conll", "read", "write"]

DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"^(?:O|[BIESLU]-\S+)$")
_OPENERS = {"iob1": "BI", "iob2": "B", "bioes": "BS", "bilou": "BU"}


@dataclass(frozen=True)
class _Token:
    text: str
    tag: str
    line: int


def looks_like_conll(lines: Sequence[str]) -> bool:
    """Whether the first lines of a text file read as token/tag columns (what format detection asks)."""
    rows = [line.split() for line in lines if line.strip()]
    rows = [row for row in rows if row[0] != DOCSTART]
    return bool(rows) and all(len(row) >= 2 and _TAG.match(row[-1]) for row in rows)


def read(uri: str, options: FormatOptions) -> tuple[list[Document], list[str]]:
    problems = Problems(uri, "CoNLL/BIO columns")
    sentences = _sentences(uri, options, problems)
    scheme = options.scheme
    notes = []
    if scheme == "auto":
        scheme, why = detect_scheme(sentences)
        notes.append(f"tag scheme {scheme} (detected: {why}; pass --scheme to choose)")
    documents = []
    for sentence in sentences:
        spans = _Decoder(sentence, scheme, problems).decode()
        if spans is None:
            continue
        starts, text = [], ""
        for token in sentence:
            text += " " if text else ""
            starts.append(len(text))
            text += token.text
        offsets = tuple((start, start + len(token.text)) for start, token in zip(starts, sentence, strict=True))
        doc_spans = tuple(Span(offsets[i][0], offsets[j - 1][1], options.label(label)) for i, j, label in spans)
        documents.append(Document(text, doc_spans, tokens=offsets, where=f"{uri} line {sentence[0].line}"))
    problems.raise_if_any()
    return documents, notes


def _sentences(uri: str, options: FormatOptions, problems: Problems) -> list[list[_Token]]:
    sentences: list[list[_Token]] = []
    current: list[_Token] = []
    for number, line in text_lines(uri):
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if current:
                sentences.append(current)
            current = []
            continue
        n = len(columns)
        in_range = all(-n <= index < n for index in (options.token_column, options.tag_column))
        if not in_range or options.token_column % n == options.tag_column % n:
            problems.add(
                f"line {number}: {len(columns)} column(s) {line.strip()!r}, but the token is in column "
                f"{options.token_column} and the tag in column {options.tag_column}; pass --tag-column/--token-column "
                "for this file's layout (tokens may not contain spaces)"
            )
            continue
        current.append(_Token(columns[options.token_column], columns[options.tag_column], number))
    if current:
        sentences.append(current)
    return sentences


def detect_scheme(sentences: Sequence[Sequence[_Token]]) -> tuple[str, str]:
    """The scheme the tags use, and why it was chosen."""
    prefixes = {token.tag[0] for sentence in sentences for token in sentence if token.tag != "O"}
    if prefixes & {"E", "S"}:
        return "bioes", "E-/S- tags"
    if prefixes & {"L", "U"}:
        return "bilou", "L-/U- tags"
    for sentence in sentences:
        previous = "O"
        for token in sentence:
            if token.tag.startswith("I-") and previous[2:] != token.tag[2:]:
                return "iob1", f"an I- tag opens an entity at line {token.line}"
            previous = token.tag
    return "iob2", "every entity opens with B-"


class _Decoder:
    """Tags of one sentence into entities ``(first token, end token, label)``; problems go to ``problems``."""

    def __init__(self, sentence: Sequence[_Token], scheme: str, problems: Problems) -> None:
        self.sentence, self.scheme, self.problems = sentence, scheme, problems
        self.closing = scheme in ("bioes", "bilou")  # an entity must end with E-/L- (or be one S-/U- token)
        self.spans: list[tuple[int, int, str]] = []
        self.open_at, self.open_label, self.bad = -1, "", False

    def decode(self) -> list[tuple[int, int, str]] | None:
        for i, token in enumerate(self.sentence):
            self._token(i, token)
        self._unclosed(self.sentence[-1], "at the sentence end")
        self._close(len(self.sentence))
        return None if self.bad else self.spans

    def _token(self, i: int, token: _Token) -> None:
        tag = token.tag
        if tag == "O":
            self._unclosed(token, "")
            self._close(i)
            return
        if not _TAG.match(tag) or tag[0] not in _prefixes(self.scheme):
            what = f"tag {tag!r} is not O or {'/'.join(_prefixes(self.scheme))}-LABEL (scheme {self.scheme})"
            self._problem(token, what, hint="scheme")
            self._close(i)
            return
        prefix, label = tag[0], tag[2:]
        continues = self.open_at >= 0 and self.open_label == label
        if prefix in _OPENERS[self.scheme] and not (self.scheme == "iob1" and prefix == "I" and continues):
            self._unclosed(token, f"before {tag}")
            self._close(i)
            self.open_at, self.open_label = i, label
        elif not continues:
            after = self.sentence[i - 1].tag if i else "the sentence start"
            hint = "iob1" if self.scheme == "iob2" else "scheme"
            self._problem(token, f"{tag} does not continue an entity of label {label!r} (after {after})", hint=hint)
            self._close(i)
            return
        if self.closing and prefix in ("S", "U", "E", "L"):
            self._close(i + 1)

    def _close(self, end: int) -> None:
        if self.open_at >= 0:
            self.spans.append((self.open_at, end, self.open_label))
        self.open_at = -1

    def _unclosed(self, token: _Token, where: str) -> None:
        if self.open_at >= 0 and self.closing:
            label, line = self.open_label, self.sentence[self.open_at].line
            last = "E" if self.scheme == "bioes" else "L"
            self._problem(token, f"entity {label!r} opened at line {line} is not closed with {last}-{label} {where}")

    def _problem(self, token: _Token, what: str, *, hint: str = "") -> None:
        fix = "fix the tag"
        if hint == "iob1":
            fix += ", or read the file as IOB1 (--scheme iob1), where I- may open an entity"
        elif hint:
            fix += " or pass the file's --scheme (iob1, iob2, bioes, bilou) and --tag-column"
        self.problems.add(f"line {token.line} (token {token.text!r}): {what.rstrip()}; {fix}")
        self.bad = True


def _prefixes(scheme: str) -> str:
    return {"iob1": "BI", "iob2": "BI", "bioes": "BIES", "bilou": "BILU"}[scheme]


# ---- writing ------------------------------------------------------------------------------------------------


def write(documents: Sequence[Document], options: FormatOptions) -> bytes:
    scheme = "iob2" if options.scheme == "auto" else options.scheme
    lines: list[str] = []
    for document in documents:
        spans = sorted(document.spans, key=lambda s: (s.start, s.end))
        for first, second in zip(spans, spans[1:], strict=False):
            if second.start < first.end:
                raise FormatError(
                    f"{document.where or 'a document'}: spans {_show(document, first)} and {_show(document, second)} "
                    "overlap; CoNLL holds one tag per token: write overlapping spans as label-studio or doccano"
                )
        tokens = whitespace_tokens(document.text, {b for s in spans for b in (s.start, s.end)})
        if not tokens:
            continue
        tags = ["O"] * len(tokens)
        firsts = {start: i for i, (start, _) in enumerate(tokens)}
        lasts = {end: i for i, (_, end) in enumerate(tokens)}
        for span in spans:
            if span.start not in firsts or span.end not in lasts:
                raise FormatError(
                    f"{document.where or 'a document'}: span {_show(document, span)} begins or ends with whitespace, "
                    "which CoNLL tokens cannot hold; trim the span or write label-studio, doccano or spacy"
                )
            _tag_span(tags, firsts[span.start], lasts[span.end], span.label, scheme)
        for (start, end), tag in zip(tokens, tags, strict=True):
            lines.append(f"{document.text[start:end]}\t{tag}")
        lines.append("")
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def _tag_span(tags: list[str], first: int, last: int, label: str, scheme: str) -> None:
    if any(char.isspace() for char in label):
        raise FormatError(f"label {label!r} holds whitespace, which a CoNLL column cannot; rename it (--map-label)")
    if first == last and scheme in ("bioes", "bilou"):
        tags[first] = f"{'S' if scheme == 'bioes' else 'U'}-{label}"
        return
    for i in range(first, last + 1):
        tags[i] = f"I-{label}"
    if scheme != "iob1" or (first > 0 and tags[first - 1] != "O" and tags[first - 1][2:] == label):
        tags[first] = f"B-{label}"
    if scheme in ("bioes", "bilou"):
        tags[last] = f"{'E' if scheme == 'bioes' else 'L'}-{label}"


def _show(document: Document, span: Span) -> str:
    return f"[{span.start}, {span.end}) {document.text[span.start : span.end]!r} ({span.label})"
