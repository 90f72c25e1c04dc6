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
        spans = _decode(sentence, scheme, uri, problems)
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


def _decode(sentence: Sequence[_Token], scheme: str, uri: str, problems: Problems) -> list[tuple[int, int, str]] | None:
    """(first token, end token, label) of every entity, or None after recording the sentence's problems."""
    spans: list[tuple[int, int, str]] = []
    open_at, open_label = -1, ""
    bad = False

    def close(end: int) -> None:
        nonlocal open_at
        if open_at >= 0:
            spans.append((open_at, end, open_label))
        open_at = -1

    for i, token in enumerate(sentence):
        tag = token.tag
        if tag == "O":
            if open_at >= 0 and scheme in ("bioes", "bilou"):
                bad = _problem(
                    problems,
                    token,
                    f"entity {open_label!r} opened at line {sentence[open_at].line} "
                    f"is not closed with {_last(scheme)}-{open_label}",
                )
            close(i)
            continue
        if not _TAG.match(tag) or tag[0] not in _prefixes(scheme):
            bad = _problem(
                problems,
                token,
                f"tag {tag!r} is not O or {'/'.join(_prefixes(scheme))}-LABEL (scheme {scheme})",
                hint=True,
            )
            close(i)
            continue
        prefix, label = tag[0], tag[2:]
        continues = open_at >= 0 and open_label == label
        if prefix in _OPENERS[scheme] and not (scheme == "iob1" and prefix == "I" and continues):
            if open_at >= 0 and scheme in ("bioes", "bilou"):
                bad = _problem(
                    problems,
                    token,
                    f"entity {open_label!r} opened at line {sentence[open_at].line} is "
                    f"not closed with {_last(scheme)}-{open_label} before {tag}",
                )
            close(i)
            open_at, open_label = i, label
        elif not continues:
            bad = _problem(
                problems,
                token,
                f"{tag} does not continue an entity of label {label!r} (after "
                f"{sentence[i - 1].tag if i else 'the sentence start'})",
                hint=True,
                scheme=scheme,
            )
            close(i)
            continue
        if scheme in ("bioes", "bilou") and prefix in ("S", "U", "E", "L"):
            close(i + 1)
    if open_at >= 0 and scheme in ("bioes", "bilou"):
        bad = _problem(
            problems,
            sentence[-1],
            f"entity {open_label!r} opened at line {sentence[open_at].line} "
            f"is not closed with {_last(scheme)}-{open_label} at the sentence end",
        )
    close(len(sentence))
    return None if bad else spans


def _prefixes(scheme: str) -> str:
    return {"iob1": "BI", "iob2": "BI", "bioes": "BIES", "bilou": "BILU"}[scheme]


def _last(scheme: str) -> str:
    return "E" if scheme == "bioes" else "L"


def _problem(problems: Problems, token: _Token, what: str, *, hint: bool = False, scheme: str = "") -> bool:
    fix = "fix the tag"
    if scheme == "iob2":
        fix += ", or read the file as IOB1 (--scheme iob1), where I- may open an entity"
    elif hint:
        fix += " or pass the file's --scheme (iob1, iob2, bioes, bilou) and --tag-column"
    problems.add(f"line {token.line} (token {token.text!r}): {what}; {fix}")
    return True


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
        tags[last] = f"{_last(scheme)}-{label}"


def _show(document: Document, span: Span) -> str:
    return f"[{span.start}, {span.end}) {document.text[span.start : span.end]!r} ({span.label})"
