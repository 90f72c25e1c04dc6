"""Label Studio JSON exports (a JSON array of tasks, or one task per line): span labels with character offsets and
the relations between them; and Label Studio tasks with pre-annotations, for review in Label Studio.

Reading a task: its text is ``data[KEY]`` (the one string of ``data``, else ``data["text"]``); its annotation is the
non-cancelled one (``annotation``: several are refused unless ``first`` or ``last`` is chosen); a task with none
follows ``unannotated`` (error, skip, or its ``prediction``). Each result of type ``labels`` is a span
``value.start``/``value.end`` with one span per label in ``value.labels`` (``value.text``, when present, must equal
the text at those offsets); each ``relation`` result links two of them by their result ids: ``direction`` ``right``
is from -> to, ``left`` to -> from, ``bi`` both; a relation without a label is named ``related``. Results of other
types (choices, ratings, text areas) are not entities: they are counted in the notes, never read as entities.

Writing: one task per document ``{"data": {"text"}, "annotations"|"predictions": [{"result": [...]}]}`` with
``from_name`` ``label`` and ``to_name`` ``text``, the names of Label Studio's NER template; as predictions each
result carries its ``score`` and the prediction its ``model_version`` and ``score`` (the mean of its spans').
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from prefect_gliner2.session_core.formats.document import DEFAULT_RELATION, Document, Relation, Span, checked
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import Problems, read_text

__all__ = ["FROM_NAME", "TO_NAME", "is_task", "read", "write"]

FROM_NAME, TO_NAME, TEXT_KEY = "label", "text", "text"
_SPAN_TYPES = ("labels", "hypertextlabels", "paragraphlabels")
_SKIP: list[Any] = []  # _result's answer for a task skipped by unannotated="skip"


def is_task(item: Any) -> bool:
    """Whether a parsed JSON value looks like a Label Studio task (what format detection asks)."""
    return (
        isinstance(item, Mapping)
        and isinstance(item.get("data"), Mapping)
        and ("annotations" in item or "predictions" in item or "id" in item)
    )


def read(uri: str, options: FormatOptions) -> tuple[list[Document], list[str]]:
    problems = Problems(uri, "a Label Studio JSON export")
    tasks = _tasks(uri, problems)
    documents: list[Document] = []
    skipped, ignored = 0, Counter[str]()
    for position, task in enumerate(tasks):
        where = f"task {task.get('id', position) if isinstance(task, Mapping) else position}"
        if not is_task(task):
            problems.add(f"{where}: not a Label Studio task (an object with 'data' and 'annotations')")
            continue
        text = _text(task["data"], where, problems)
        result = _result(task, options, where, problems) if text is not None else None
        if result is _SKIP:
            skipped += 1
        elif text is not None and result is not None:
            document = _document(text, result, options, f"{uri} {where}", problems, ignored)
            if document is not None:
                documents.append(replace(document, id=task.get("id")))
    problems.raise_if_any()
    notes = [f"skipped {skipped} task(s) without an annotation (--unannotated skip)"] if skipped else []
    if ignored:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(ignored.items()))
        notes.append(f"results that are not span labels or relations were not read: {kinds}")
    return documents, notes


def _tasks(uri: str, problems: Problems) -> list[Any]:
    text = read_text(uri)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            tasks = json.loads(text)
        except ValueError as exc:
            problems.add(f"invalid JSON ({exc}); export the project again as JSON")
            problems.raise_if_any()
        return list(tasks)
    tasks = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except ValueError as exc:
                problems.add(f"line {number}: invalid JSON ({exc}); one task per line, or a JSON array of tasks")
    return tasks


def _text(data: Mapping[str, Any], where: str, problems: Problems) -> str | None:
    strings = [key for key, value in data.items() if isinstance(value, str)]
    key = strings[0] if len(strings) == 1 else TEXT_KEY
    if not isinstance(data.get(key), str):
        problems.add(f"{where}: cannot tell which of data's fields {sorted(data)} holds the text; name it 'text'")
        return None
    text: str = data[key]
    return text


def _result(task: Mapping[str, Any], options: FormatOptions, where: str, problems: Problems) -> list[Any] | None:
    """The results to read: of the chosen annotation, or of the prediction (``unannotated="prediction"``)."""
    annotations = [a for a in task.get("annotations") or [] if isinstance(a, Mapping) and not a.get("was_cancelled")]
    if not annotations:
        predictions = [p for p in task.get("predictions") or [] if isinstance(p, Mapping)]
        if options.unannotated == "skip":
            return _SKIP
        if options.unannotated == "prediction" and predictions:
            annotations = predictions
        else:
            has = f" (it has {len(predictions)} prediction(s))" if predictions else ""
            problems.add(
                f"{where}: no annotation{has}; annotate it, export only annotated tasks, or pass --unannotated skip "
                "(or --unannotated prediction to take its pre-annotation as it is)"
            )
            return None
    if len(annotations) > 1 and options.annotation == "only":
        problems.add(
            f"{where}: {len(annotations)} annotations (several annotators?); pass --annotation first or last to "
            "choose one"
        )
        return None
    chosen = annotations[-1] if options.annotation == "last" else annotations[0]
    result = chosen.get("result")
    if not isinstance(result, list):
        problems.add(f"{where}: the annotation has no 'result' list")
        return None
    return result


def _document(
    text: str, result: list[Any], options: FormatOptions, where: str, problems: Problems, ignored: Counter[str]
) -> Document | None:
    spans: list[Span] = []
    by_id: dict[str, list[int]] = {}
    links = []
    for item in result:
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "relation":
            links.append(item)
            continue
        if kind not in _SPAN_TYPES:
            ignored[str(kind)] += 1
            continue
        value = item.get("value")
        rid = item.get("id", "?")
        if not isinstance(value, Mapping) or not _is_int(value.get("start")) or not _is_int(value.get("end")):
            problems.add(
                f"{where} result {rid!r}: no integer value.start/value.end character offsets (rich-text labels "
                "carry XPath offsets); label the text with a Text object tag and export again"
            )
            continue
        start, end = value["start"], value["end"]
        if "text" in value and 0 <= start < end <= len(text) and text[start:end] != value["text"]:
            problems.add(
                f"{where} result {rid!r}: offsets [{start}, {end}) hold {text[start:end]!r} but the result says "
                f"{value['text']!r}; the task text changed after annotation: re-annotate or fix the offsets"
            )
            continue
        labels = value.get(kind) or value.get("labels")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
            problems.add(f"{where} result {rid!r}: value.{kind} must be a non-empty list of label names")
            continue
        for label in labels:
            by_id.setdefault(str(rid), []).append(len(spans))
            spans.append(Span(start, end, options.label(label), _score(item)))
    relations = _relations(links, by_id, where, problems)
    if relations is None:
        return None
    return checked(Document(text, tuple(spans), tuple(relations), where=where), problems.add)


def _relations(
    links: list[Mapping[str, Any]], by_id: Mapping[str, list[int]], where: str, problems: Problems
) -> list[Relation] | None:
    relations = []
    for link in links:
        ends = [by_id.get(str(link.get(key))) for key in ("from_id", "to_id")]
        if ends[0] is None or ends[1] is None:
            problems.add(
                f"{where}: relation {link.get('from_id')!r} -> {link.get('to_id')!r} names a region that is not a "
                "span label of this annotation; remove the relation or restore the region"
            )
            return None
        labels = link.get("labels") or [DEFAULT_RELATION]
        direction = link.get("direction", "right")
        pairs = {"right": [(0, 1)], "left": [(1, 0)], "bi": [(0, 1), (1, 0)]}.get(direction)
        if pairs is None:
            problems.add(f"{where}: relation direction {direction!r} is not right, left or bi")
            return None
        for label in labels:
            for a, b in pairs:
                for head in ends[a] or []:
                    for tail in ends[b] or []:
                        relations.append(Relation(head, tail, str(label)))
    return relations


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _score(item: Mapping[str, Any]) -> float | None:
    score = item.get("score")
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None


# ---- writing ------------------------------------------------------------------------------------------------


def write(
    documents: Sequence[Document], options: FormatOptions, *, predictions: bool = False, model_version: str = ""
) -> bytes:
    tasks = []
    for number, document in enumerate(documents):
        result = _results(document, f"s{number}-", predictions)
        task: dict[str, Any] = {"data": {TEXT_KEY: document.text}}
        if document.id is not None:
            task["data"]["id"] = document.id
        if predictions:
            scores = [s.score for s in document.spans if s.score is not None]
            score = sum(scores) / len(scores) if scores else 0.0
            task["predictions"] = [{"model_version": model_version, "score": score, "result": result}]
        else:
            task["annotations"] = [{"result": result}]
        tasks.append(task)
    return (json.dumps(tasks, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _results(document: Document, prefix: str, predictions: bool) -> list[dict[str, Any]]:
    """A document's spans as ``labels`` regions (ids ``prefix`` + index) and its relations between them."""
    result: list[dict[str, Any]] = []
    for i, span in enumerate(document.spans):
        value = {"start": span.start, "end": span.end, "text": document.text[span.start : span.end]}
        region: dict[str, Any] = {"id": f"{prefix}{i}", "from_name": FROM_NAME, "to_name": TO_NAME, "type": "labels"}
        region["value"] = {**value, "labels": [span.label]}
        if predictions and span.score is not None:
            region["score"] = span.score
        result.append(region)
    for relation in document.relations:
        ends = {"from_id": f"{prefix}{relation.head}", "to_id": f"{prefix}{relation.tail}"}
        result.append({**ends, "type": "relation", "direction": "right", "labels": [relation.label]})
    return result
