"""doccano JSONL exports: sequence labeling (``{"text", "label": [[start, end, label], ...]}``; older exports say
``"labels"``) and relation extraction (``{"text", "entities": [{"id", "label", "start_offset", "end_offset"}],
"relations": [{"id", "from_id", "to_id", "type"}]}``). Written: the sequence-labeling form, or the relation form
when a document has relations; doccano imports both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.formats.document import Document, Relation, Span, checked
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import Problems, json_lines

__all__ = ["is_doccano_record", "read", "write"]


def is_doccano_record(item: Mapping[str, Any]) -> bool:
    """Whether a parsed line looks like a doccano export (what format detection asks)."""
    if not isinstance(item.get("text"), str):
        return False
    entities = item.get("entities")
    if isinstance(entities, list) and entities and all(isinstance(e, Mapping) for e in entities):
        return all("start_offset" in e for e in entities)
    labels = item.get("label", item.get("labels"))
    return isinstance(labels, list) and (not labels or all(isinstance(x, list) and len(x) == 3 for x in labels))


def read(uri: str, options: FormatOptions) -> tuple[list[Document], list[str]]:
    problems = Problems(uri, "a doccano JSONL export")
    documents = []
    for number, item in json_lines(uri, problems):
        where = f"line {number}"
        if not isinstance(item, Mapping) or not isinstance(item.get("text"), str):
            problems.add(f"{where}: expected an object with a 'text' string (doccano's JSONL export)")
            continue
        parsed = _relation_form(item, where, problems) if "entities" in item else _labels(item, where, problems)
        if parsed is None:
            continue
        spans, relations = parsed
        spans = [Span(s.start, s.end, options.label(s.label)) for s in spans]
        document = Document(item["text"], tuple(spans), tuple(relations), where=f"{uri} {where}", id=item.get("id"))
        found = checked(document, problems.add)
        if found is not None:
            documents.append(found)
    problems.raise_if_any()
    return documents, []


def _labels(item: Mapping[str, Any], where: str, problems: Problems) -> tuple[list[Span], list[Relation]] | None:
    key = "label" if "label" in item else "labels"
    labels = item.get(key, [])
    if not isinstance(labels, list):
        problems.add(f"{where}: '{key}' must be a list of [start, end, label]")
        return None
    spans = []
    for entry in labels:
        if isinstance(entry, str):
            problems.add(
                f"{where}: '{key}' holds category names ({entry!r}): a text classification export; export the "
                "sequence labeling project instead"
            )
            return None
        if not (isinstance(entry, list) and len(entry) == 3 and _is_int(entry[0]) and _is_int(entry[1])):
            problems.add(f"{where}: {key} entry {entry!r} is not [start, end, label] with integer offsets")
            return None
        if not isinstance(entry[2], str) or not entry[2]:
            problems.add(f"{where}: {key} entry {entry!r} has no label name")
            return None
        spans.append(Span(entry[0], entry[1], entry[2]))
    return spans, []


def _relation_form(item: Mapping[str, Any], where: str, problems: Problems) -> tuple[list[Span], list[Relation]] | None:
    spans: list[Span] = []
    index: dict[Any, int] = {}
    for entity in item.get("entities") or []:
        if not (
            isinstance(entity, Mapping)
            and _is_int(entity.get("start_offset"))
            and _is_int(entity.get("end_offset"))
            and isinstance(entity.get("label"), str)
            and entity["label"]
        ):
            problems.add(f"{where}: entity {entity!r} needs integer start_offset/end_offset and a label")
            return None
        index[entity.get("id", len(spans))] = len(spans)
        spans.append(Span(entity["start_offset"], entity["end_offset"], entity["label"]))
    relations = []
    for relation in item.get("relations") or []:
        ends = [index.get(relation.get(key)) if isinstance(relation, Mapping) else None for key in ("from_id", "to_id")]
        if ends[0] is None or ends[1] is None or not isinstance(relation.get("type"), str):
            problems.add(f"{where}: relation {relation!r} must name two entity ids (from_id, to_id) and a type")
            return None
        relations.append(Relation(ends[0], ends[1], relation["type"]))
    return spans, relations


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def write(documents: Sequence[Document], options: FormatOptions) -> bytes:
    lines = []
    for document in documents:
        item: dict[str, Any] = {} if document.id is None else {"id": document.id}
        item["text"] = document.text
        if document.relations:
            item["entities"] = [
                {"id": i, "label": s.label, "start_offset": s.start, "end_offset": s.end}
                for i, s in enumerate(document.spans)
            ]
            item["relations"] = [
                {"id": i, "from_id": r.head, "to_id": r.tail, "type": r.label} for i, r in enumerate(document.relations)
            ]
        else:
            item["label"] = [[s.start, s.end, s.label] for s in document.spans]
        lines.append(json.dumps(item, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")
