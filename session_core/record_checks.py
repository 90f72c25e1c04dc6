"""Structural checks of one native GLiNER2 record, mirroring gliner2's InputExample.validate without gliner2.

Mentions and values must occur in the text (case-insensitively) or be exact ``{"text", "start", "end"}`` spans;
types are checked, and unknown keys are refused (with a suggestion) instead of ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["OUTPUT_KEYS", "TEXT_FORMAT_KEYS", "check_record", "key_problems", "suggest"]

OUTPUT_KEYS: tuple[str, ...] = (
    "entities",
    "entity_descriptions",
    "classifications",
    "json_structures",
    "json_descriptions",
    "record_metadata",
    "relations",
    "relation_descriptions",
)
# The annotation keys the native loader lifts from a top-level {"text": ...} record.
TEXT_FORMAT_KEYS: tuple[str, ...] = ("entities", "classifications", "relations", "json_structures")
_OUTPUT_KEY_SET = frozenset(OUTPUT_KEYS)


_CONTAINERS = (dict, list, tuple)
# Output values whose inner structure check_record does not inspect key by key.
_OPAQUE_KEYS = ("classifications", "json_descriptions", "record_metadata", "relation_descriptions")


def key_problems(output: Mapping[str, Any]) -> list[str]:
    """Dict keys JSON would silently turn into strings (only possible for in-memory records)."""
    stack = [output[k] for k in _OPAQUE_KEYS if k in output]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, inner in value.items():
                if not isinstance(key, str):
                    return [f"'output' has a non-string key {key!r}; JSON object keys must be strings"]
                if isinstance(inner, _CONTAINERS):
                    stack.append(inner)
        elif isinstance(value, (list, tuple)):
            stack.extend(inner for inner in value if isinstance(inner, _CONTAINERS))
    return []


def suggest(name: Any, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------------------- validation
# Mirrors gliner2 InputExample.validate (and the Classification/Structure/Relation validators) without gliner2.

_NO_TASK = (
    "no task: 'output' needs at least one of entities, classifications, json_structures or relations; a negative "
    "example declares the labels it is negative for, e.g. {'entities': {'person': [], 'company': []}}"
)


def _is_map(value: Any) -> bool:
    return isinstance(value, dict) or isinstance(value, Mapping)


def check_record(text: Any, output: Any) -> list[str]:
    """Every structural problem of one native record (empty list: valid)."""
    if not isinstance(text, str):
        return [f"'input' must be a string, got {type(text).__name__}"]
    if not text.strip():
        return ["'input' text is empty"]
    if not _is_map(output):
        return [f"'output' must be an object of tasks, got {type(output).__name__}"]
    problems = [
        f"unknown output key {k!r}{suggest(k, OUTPUT_KEYS)}; known keys are {list(OUTPUT_KEYS)}"
        for k in output
        if k not in _OUTPUT_KEY_SET
    ]
    lowered = text.lower()
    if "entities" in output or "entity_descriptions" in output:
        _check_entities(output, text, lowered, problems)
    if "classifications" in output:
        _check_classifications(output["classifications"], problems)
    if "json_structures" in output:
        _check_named_groups(output["json_structures"], "json_structures", "structure", text, lowered, problems)
    if "relations" in output:
        _check_named_groups(output["relations"], "relations", "relation", text, lowered, problems)
    for key in ("json_descriptions", "record_metadata", "relation_descriptions"):
        if key in output and not _is_map(output[key]):
            problems.append(f"'{key}' must be an object, got {type(output[key]).__name__}")
    if not problems and not (
        output.get("entities")
        or output.get("classifications")
        or output.get("json_structures")
        or output.get("relations")
    ):
        problems.append(_NO_TASK)
    return problems


def _locate(value: Any, text: str, lowered: str) -> str | None:
    """None when ``value`` is locatable in ``text`` (as gliner2's ``_is_locatable``), else why not."""
    if isinstance(value, str):
        return None if not value or value.lower() in lowered else "not found in text (case-insensitive)"
    if value is None:
        return None
    if isinstance(value, list):
        for inner in value:
            reason = _locate(inner, text, lowered)
            if reason:
                return f"item {inner!r} {reason}"
        return None
    if _is_map(value):
        return _locate_span(value, text)
    return f"must be a string or a {{'text', 'start', 'end'}} span, got {type(value).__name__}"


def _locate_span(span: Mapping[str, Any], text: str) -> str | None:
    missing = sorted({"text", "start", "end"} - set(span))
    if missing:
        return f"is a span missing {missing}"
    start, end = span["start"], span["end"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return "is a span whose start/end are not integers"
    if not 0 <= start < end:
        return f"is a span with invalid offsets [{start}, {end})"
    if text[start:end] != span["text"]:
        return f"is a span whose offsets [{start}, {end}) hold {text[start:end]!r}, not {span['text']!r}"
    return None


def _check_entities(output: Mapping[str, Any], text: str, lowered: str, problems: list[str]) -> None:
    entities = output.get("entities")
    if entities is not None and not _is_map(entities):
        problems.append(f"'entities' must be an object of type -> list of mentions, got {type(entities).__name__}")
        entities = None
    for etype, mentions in (entities or {}).items():
        if not isinstance(etype, str) or not etype:
            problems.append(f"entity type {etype!r} must be a non-empty string")
        if not isinstance(mentions, list):
            problems.append(
                f"entities[{etype!r}] must be a list of mentions, got {type(mentions).__name__}; wrap it in a list"
            )
            continue
        for mention in mentions:
            if isinstance(mention, str):  # the common case, inlined
                if mention and mention.lower() not in lowered:
                    problems.append(f"entity {mention!r} (type: {etype}) not found in text (case-insensitive)")
                continue
            reason = _locate(mention, text, lowered)
            if reason:
                problems.append(f"entity {mention!r} (type: {etype}) {reason}")
    descriptions = output.get("entity_descriptions")
    if descriptions is None:
        return
    if not _is_map(descriptions):
        problems.append(
            f"'entity_descriptions' must be an object of type -> description, got {type(descriptions).__name__}"
        )
        return
    declared = entities if isinstance(entities, Mapping) else {}
    for etype, desc in descriptions.items():
        if not isinstance(desc, str):
            problems.append(f"entity_descriptions[{etype!r}] must be a string, got {type(desc).__name__}")
        if etype not in declared:
            problems.append(
                f"entity_descriptions describes {etype!r}, which is not in entities; add {etype!r}: [] to entities "
                "to train it as a negative, or remove the description"
            )


def _check_classifications(tasks: Any, problems: list[str]) -> None:
    if tasks is None:
        return
    if not isinstance(tasks, list):
        problems.append(f"'classifications' must be a list, got {type(tasks).__name__}")
        return
    for i, task in enumerate(tasks):
        if not _is_map(task):
            problems.append(f"classification {i} must be an object, got {type(task).__name__}")
            continue
        missing = [k for k in ("task", "labels", "true_label") if k not in task]
        if missing:
            problems.append(f"classification {i} is missing {missing}")
            continue
        name, labels, true = task["task"], task["labels"], task["true_label"]
        if not isinstance(name, str) or not name:
            problems.append(f"classification {i}: task name must be a non-empty string")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            problems.append(f"classification {name!r} must have a non-empty list of string labels")
            continue
        trues = [true] if isinstance(true, str) else true
        if not isinstance(trues, list) or not all(isinstance(x, str) for x in trues):
            problems.append(f"classification {name!r}: true_label must be a string or a list of strings")
            continue
        problems.extend(f"true label {t!r} not in labels list for task {name!r}" for t in trues if t not in labels)
        _check_classification_extras(task, name, labels, problems)


def _check_classification_extras(task: Mapping[str, Any], name: Any, labels: list[str], problems: list[str]) -> None:
    if not isinstance(task.get("multi_label", False), bool):
        problems.append(f"classification {name!r}: multi_label must be true or false")
    descriptions = task.get("label_descriptions")
    if descriptions is not None:
        if not _is_map(descriptions):
            problems.append(f"classification {name!r}: label_descriptions must be an object")
        else:
            problems.extend(
                f"label description key {k!r} not in labels for task {name!r}" for k in descriptions if k not in labels
            )
    examples = task.get("examples")
    if examples is not None:
        if not isinstance(examples, list):
            problems.append(f"classification {name!r}: examples must be a list of [input, output] pairs")
            return
        problems.extend(
            f"example {j} for task {name!r} must be an [input, output] pair"
            for j, ex in enumerate(examples)
            if not isinstance(ex, (list, tuple)) or len(ex) != 2
        )


def _check_named_groups(groups: Any, key: str, kind: str, text: str, lowered: str, problems: list[str]) -> None:
    """json_structures / relations: lists of ``{name: {field: value}}`` objects."""
    if groups is None:
        return
    if not isinstance(groups, list):
        problems.append(f"'{key}' must be a list of {{name: {{field: value}}}} objects, got {type(groups).__name__}")
        return
    field_sets: dict[str, tuple[str, ...]] = {}
    for i, group in enumerate(groups):
        if not _is_map(group) or not group:
            problems.append(f"{key}[{i}] must be a non-empty {{name: {{field: value}}}} object")
            continue
        for name, fields in group.items():
            if not isinstance(name, str) or not name:
                problems.append(f"{kind} name {name!r} in {key}[{i}] must be a non-empty string")
            if not _is_map(fields) or not fields:
                problems.append(f"{kind} {name!r} has no fields")
                continue
            for fname, value in fields.items():
                if not isinstance(fname, str) or not fname:
                    problems.append(f"{kind} {name!r} field name {fname!r} must be a non-empty string")
                reason = _field_problem(value, kind, text, lowered)
                if reason:
                    problems.append(f"{kind} value {value!r} for '{name}.{fname}' {reason}")
            if kind == "relation":
                names = tuple(sorted(str(f) for f in fields))
                if field_sets.setdefault(str(name), names) != names:
                    problems.append(f"relation {name!r} has inconsistent fields: {field_sets[str(name)]} vs {names}")


def _field_problem(value: Any, kind: str, text: str, lowered: str) -> str | None:
    if kind == "structure" and _is_map(value) and "value" in value and "choices" in value:
        choices = value["choices"]
        if not isinstance(choices, list) or value["value"] not in choices:
            return f"is a choice field whose value is not in its choices {choices!r}"
        return None
    return _locate(value, text, lowered)
