"""spaCy-style JSONL: one JSON object per line with the ``text`` and its entities as character offsets; no spaCy
needed.

Read, per line: ``"ents": [{"start", "end", "label"}]`` (what spaCy's ``Doc.to_json()`` writes), ``"spans"`` as a
list of ``{"start", "end", "label"}`` (Prodigy's form) or, with ``spans_key``, as spaCy's dict of span groups
``{"KEY": [...]}``, or ``"entities": [[start, end, label], ...]`` (spaCy's ``(text, {"entities": [...]})``
training tuples). Other keys (``tokens``, ``sents``, ``meta``...) are left alone. Written: ``{"text", "ents"}``
(``{"text", "spans": {KEY: [...]}}`` with ``spans_key``), which ``Doc.from_json`` reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.formats.document import Document, Span, checked
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import Problems, json_lines

__all__ = ["is_spacy_record", "read", "write"]


def is_spacy_record(item: Mapping[str, Any]) -> bool:
    """Whether a parsed line looks like this format (what format detection asks)."""
    if not isinstance(item.get("text"), str):
        return False
    entities = item.get("entities")
    triples = isinstance(entities, list) and bool(entities) and all(isinstance(e, list) for e in entities)
    return "ents" in item or isinstance(item.get("spans"), (list, dict)) or triples


def read(uri: str, options: FormatOptions) -> tuple[list[Document], list[str]]:
    problems = Problems(uri, "spaCy JSONL")
    documents = []
    for number, item in json_lines(uri, problems):
        where = f"line {number}"
        if not isinstance(item, Mapping) or not isinstance(item.get("text"), str):
            problems.add(f"{where}: expected an object with a 'text' string")
            continue
        spans = _spans(item, options, where, problems)
        if spans is None:
            continue
        document = Document(item["text"], tuple(spans), where=f"{uri} {where}", id=item.get("id"))
        documents.append(checked(document, problems.add))
    problems.raise_if_any()
    return [d for d in documents if d is not None], []


def _spans(item: Mapping[str, Any], options: FormatOptions, where: str, problems: Problems) -> list[Span] | None:
    if options.spans_key is not None:
        groups = item.get("spans")
        if not isinstance(groups, Mapping) or options.spans_key not in groups:
            found = sorted(groups) if isinstance(groups, Mapping) else "none"
            problems.add(f"{where}: no span group {options.spans_key!r} under 'spans' (groups: {found})")
            return None
        raw: Any = groups[options.spans_key]
    elif "ents" in item:
        raw = item["ents"]
    elif isinstance(item.get("spans"), list):
        raw = item["spans"]
    elif isinstance(item.get("spans"), Mapping):
        problems.add(f"{where}: 'spans' holds span groups {sorted(item['spans'])}; pass --spans-key to read one")
        return None
    else:
        raw = item.get("entities", [])
    if not isinstance(raw, list):
        problems.add(f"{where}: entities must be a list, got {type(raw).__name__}")
        return None
    spans = []
    for position, entry in enumerate(raw):
        if isinstance(entry, Mapping) and {"start", "end", "label"} <= set(entry):
            start, end, label = entry["start"], entry["end"], entry["label"]
        elif isinstance(entry, list) and len(entry) == 3:
            start, end, label = entry
        else:
            problems.add(f"{where}: entity {position} {entry!r} is not {{start, end, label}} or [start, end, label]")
            return None
        if not (_is_int(start) and _is_int(end) and isinstance(label, str) and label):
            problems.add(f"{where}: entity {position} {entry!r} needs integer start/end and a label name")
            return None
        spans.append(Span(start, end, options.label(label)))
    return spans


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def write(documents: Sequence[Document], options: FormatOptions) -> bytes:
    lines = []
    for document in documents:
        spans = [{"start": s.start, "end": s.end, "label": s.label} for s in document.spans]
        item: dict[str, Any] = {"text": document.text}
        if options.spans_key is not None:
            item["spans"] = {options.spans_key: spans}
        else:
            item["ents"] = spans
        lines.append(json.dumps(item, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")
