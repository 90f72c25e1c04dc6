"""The format-neutral annotated document every reader returns and every writer takes, and its native record form.

A :class:`Document` is a text, its labelled character spans (``end`` exclusive), the relations between them, its
tokens when the source was tokenized (CoNLL, spaCy), and where it came from (file and line or record, for messages).
:func:`to_record` turns one into gliner2's native record: every mention a ``{"text", "start", "end"}`` span, so
repeated mentions stay distinct (gliner2 2.1 trains a span at exactly those offsets; a plain string marks every
occurrence of it in the text), and every label of the data declared, ``[]`` where the document has none of it.
:func:`from_record` is the inverse for records whose mentions are spans (what :func:`to_record` and the extraction
writers produce).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prefect_gliner2.session_core.errors import FormatError

__all__ = [
    "DEFAULT_RELATION",
    "Document",
    "Relation",
    "Span",
    "checked",
    "data_labels",
    "from_record",
    "span_dict",
    "to_record",
]

DEFAULT_RELATION = "related"  # the name of a relation its source leaves unlabelled (Label Studio allows that)


@dataclass(frozen=True)
class Span:
    """A labelled character span ``[start, end)`` of a document's text; ``score`` is a model's confidence."""

    start: int
    end: int
    label: str
    score: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Relation:
    """A labelled, directed relation from span ``head`` to span ``tail`` (indices into the document's spans)."""

    head: int
    tail: int
    label: str


@dataclass(frozen=True)
class Document:
    """One annotated text. ``tokens`` are ``(start, end)`` character offsets when the source was tokenized;
    ``where`` names the source (``file line 12``, ``file task 3``) and ``id`` is the source's own id, if any."""

    text: str
    spans: tuple[Span, ...] = ()
    relations: tuple[Relation, ...] = ()
    tokens: tuple[tuple[int, int], ...] | None = field(default=None, compare=False)
    where: str = field(default="", compare=False)
    id: Any = field(default=None, compare=False)

    def check(self) -> None:
        """Every span inside the text and non-empty, no span twice, relations naming existing spans."""
        seen: set[tuple[int, int, str]] = set()
        for span in self.spans:
            if not (0 <= span.start < span.end <= len(self.text)):
                raise FormatError(
                    f"{self.where}: span [{span.start}, {span.end}) ({span.label}) is outside the text of "
                    f"{len(self.text)} characters; fix its offsets"
                )
            key = (span.start, span.end, span.label)
            if key in seen:
                raise FormatError(
                    f"{self.where}: span [{span.start}, {span.end}) {self.text[span.start : span.end]!r} is labelled "
                    f"{span.label!r} twice; remove the duplicate annotation"
                )
            seen.add(key)
        for relation in self.relations:
            if not (0 <= relation.head < len(self.spans) and 0 <= relation.tail < len(self.spans)):
                raise FormatError(f"{self.where}: relation {relation.label!r} names a span that does not exist")

    def normalized(self) -> Document:
        """The same document with its spans in offset order (start, end, label) and relations renumbered."""
        order = sorted(
            range(len(self.spans)), key=lambda i: (self.spans[i].start, self.spans[i].end, self.spans[i].label)
        )
        if order == list(range(len(self.spans))):
            return self
        new_index = {old: new for new, old in enumerate(order)}
        return replace(
            self,
            spans=tuple(self.spans[i] for i in order),
            relations=tuple(Relation(new_index[r.head], new_index[r.tail], r.label) for r in self.relations),
        )


def checked(document: Document, problem: Callable[[str], None]) -> Document | None:
    """The document normalized, or None after reporting why it is not valid (``Document.check``)."""
    try:
        document.check()
    except FormatError as exc:
        problem(str(exc))
        return None
    return document.normalized()


def span_dict(text: str, span: Span) -> dict[str, Any]:
    """A mention as gliner2 2.1 reads it: the covered text pinned to its offsets."""
    return {"text": text[span.start : span.end], "start": span.start, "end": span.end}


def data_labels(documents: Iterable[Document]) -> list[str]:
    """Every entity label of the documents, sorted: what each converted record declares."""
    return sorted({span.label for document in documents for span in document.spans})


def to_record(document: Document, labels: Sequence[str]) -> dict[str, Any]:
    """The native record of a document: ``entities`` lists every one of ``labels`` (sorted mentions by offset, ``[]``
    for a label the document lacks); ``relations`` holds ``{label: {"head": span, "tail": span}}`` when it has any."""
    entities: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    for span in sorted(document.spans, key=lambda s: (s.start, s.end, s.label)):
        if span.label not in entities:
            raise FormatError(f"{document.where}: label {span.label!r} is not among the declared labels {labels}")
        entities[span.label].append(span_dict(document.text, span))
    output: dict[str, Any] = {"entities": entities}
    if document.relations:
        output["relations"] = [
            {
                relation.label: {
                    "head": span_dict(document.text, document.spans[relation.head]),
                    "tail": span_dict(document.text, document.spans[relation.tail]),
                }
            }
            for relation in document.relations
        ]
    return {"input": document.text, "output": output}


def from_record(record: Mapping[str, Any], where: str = "") -> Document:
    """A native record whose entity mentions are ``{"text", "start", "end"}`` spans as a Document (relation heads and
    tails must be entity mentions too). A mention given as a plain string has no offsets: refused, since it stands
    for every occurrence of its text."""
    text = record.get("input", record.get("text"))
    if not isinstance(text, str):
        raise FormatError(f"{where}: a record needs its text under 'input'")
    output = record.get("output", {})
    spans: list[Span] = []
    for label, mentions in (output.get("entities") or {}).items():
        for mention in mentions:
            start, end = _offsets(mention, f"{where}: mention {mention!r} ({label})")
            spans.append(Span(start, end, label, _score(mention)))
    at = {(span.start, span.end): i for i, span in reversed(list(enumerate(spans)))}
    relations = []
    for group in output.get("relations") or []:
        for label, fields in group.items():
            ends = []
            for role in ("head", "tail"):
                what = f"{where}: relation {label!r} {role} {fields.get(role)!r}"
                key = _offsets(fields.get(role), what)
                if key not in at:
                    raise FormatError(f"{what} is not an entity mention of the record; list it under 'entities'")
                ends.append(at[key])
            relations.append(Relation(ends[0], ends[1], label))
    document = Document(text, tuple(spans), tuple(relations), where=where, id=record.get("id"))
    document.check()
    return document.normalized()


def _offsets(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, Mapping) or not {"start", "end"} <= set(value):
        raise FormatError(
            f"{what} has no character offsets; writing a format needs {{'text', 'start', 'end'}} spans (a plain "
            "string stands for every occurrence of its text)"
        )
    return int(value["start"]), int(value["end"])


def _score(value: Mapping[str, Any]) -> float | None:
    score = value.get("confidence", value.get("score"))
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
