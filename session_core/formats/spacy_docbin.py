"""spaCy ``DocBin`` files (``.spacy``, what ``spacy convert`` and spaCy training use), read and written with spaCy.

spaCy is an optional dependency (``pip install 'prefect-gliner2[formats]'``), imported only here and only when a
DocBin is read or written; note that spaCy's ``thinc`` imports torch when it is installed, so this costs a few
seconds. Entities are ``doc.ents`` (flat, no overlap), or the span group ``doc.spans[spans_key]`` (may overlap)
when ``spans_key`` is set; offsets are spaCy's character offsets into ``doc.text``. Writing builds each Doc on the
exact text (whitespace kept as spaCy keeps it), split so every span covers whole tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect_gliner2.session_core.errors import FormatError
from prefect_gliner2.session_core.formats.document import Document, Span
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import Problems, read_bytes
from prefect_gliner2.session_core.formats.tokens import runs

__all__ = ["read", "write"]


def _spacy() -> Any:
    try:
        import spacy
    except ImportError:
        raise FormatError(
            "reading or writing spaCy DocBin (.spacy) files needs spaCy: pip install 'prefect-gliner2[formats]' "
            "(or spacy>=3.8,<3.9); spaCy JSONL (--format spacy-jsonl) needs no spaCy"
        ) from None
    return spacy


def read(uri: str, options: FormatOptions) -> tuple[list[Document], list[str]]:
    spacy = _spacy()
    from spacy.tokens import DocBin

    problems = Problems(uri, "a spaCy DocBin")
    try:
        docs = list(DocBin().from_bytes(read_bytes(uri)).get_docs(spacy.vocab.Vocab()))
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError(
            f"{uri} is not a spaCy DocBin ({type(exc).__name__}: {exc}); write it with DocBin.to_disk, or pass the "
            "file's --format"
        ) from None
    documents = []
    group_keys: set[str] = set()
    for number, doc in enumerate(docs):
        group_keys.update(doc.spans.keys())
        found = doc.spans.get(options.spans_key, ()) if options.spans_key is not None else doc.ents
        spans = tuple(Span(s.start_char, s.end_char, options.label(s.label_)) for s in found)
        tokens = tuple((t.idx, t.idx + len(t.text)) for t in doc)
        documents.append(Document(doc.text, spans, tokens=tokens, where=f"{uri} doc {number}").normalized())
    if options.spans_key is not None and options.spans_key not in group_keys:
        problems.add(f"no doc has the span group {options.spans_key!r} (the groups are {sorted(group_keys)})")
    if options.spans_key is None and group_keys and not any(d.spans for d in documents):
        problems.add(
            f"no doc has entities (doc.ents) but span groups {sorted(group_keys)} exist; pass --spans-key to read one"
        )
    problems.raise_if_any()
    return documents, []


def write(documents: Sequence[Document], options: FormatOptions) -> bytes:
    spacy = _spacy()
    from spacy.tokens import Doc, DocBin

    vocab = spacy.vocab.Vocab()
    out = DocBin(store_user_data=False)
    for document in documents:
        doc = _doc(Doc, vocab, document)
        spans = []
        for span in document.spans:
            made = doc.char_span(span.start, span.end, label=span.label, alignment_mode="strict")
            assert made is not None, "tokens are split at every span boundary"
            spans.append(made)
        if options.spans_key is not None:
            doc.spans[options.spans_key] = spans
        else:
            try:
                doc.ents = spans
            except ValueError:
                raise FormatError(
                    f"{document.where or 'a document'}: its spans overlap and doc.ents cannot hold overlapping "
                    "entities; write them to a span group (--spans-key sc)"
                ) from None
        out.add(doc)
    data: bytes = out.to_bytes()
    return data


def _doc(doc_class: Any, vocab: Any, document: Document) -> Any:
    """A Doc whose text is exactly ``document.text``: words with spaCy's one trailing space, extra whitespace as
    whitespace tokens."""
    words: list[str] = []
    spaces: list[bool] = []
    starts = {s.start for s in document.spans}
    ends = {s.end for s in document.spans}
    for start, end, is_space in runs(document.text, starts | ends):
        piece = document.text[start:end]
        # one space after a word is that word's trailing space, unless a span begins at it or ends just after it
        if (
            is_space
            and piece[0] == " "
            and words
            and not spaces[-1]
            and not words[-1].isspace()
            and start not in starts
            and start + 1 not in ends
        ):
            spaces[-1] = True
            piece = piece[1:]
            if not piece:
                continue
        words.append(piece)
        spaces.append(False)
    doc = doc_class(vocab, words=words, spaces=spaces)
    if doc.text != document.text:
        raise FormatError(f"{document.where or 'a document'}: spaCy could not hold its text exactly")
    return doc
