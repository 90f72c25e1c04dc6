"""Reading gold records and gliner2's formatted payloads for scoring: normalized texts, entity maps, relation tuples,
classification tasks, structure instances (pure Python; a malformed record raises ``RecordError`` saying what it got).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.errors import RecordError

__all__ = [
    "RELATION_KEY",
    "as_list",
    "classification",
    "entity_map",
    "field_values",
    "is_choice",
    "normalize_text",
    "predicted_labels",
    "relation_items",
    "relation_tuple",
    "structure_items",
    "texts",
]

RELATION_KEY = "relation_extraction"  # where gliner2's formatted payload puts relations
_SPACE = re.compile(r"\s+")


def normalize_text(value: Any) -> str:
    """The text a mention is matched by: a span dict's ``text``, whitespace trimmed and collapsed, case kept."""
    if isinstance(value, Mapping):
        value = value.get("text", "")
    if value is None:
        return ""
    return _SPACE.sub(" ", str(value)).strip()


def as_list(value: Any) -> list[Any]:
    """A value as a list: None is empty, a list or tuple is itself, anything else is one item."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def texts(values: Any) -> list[str]:
    """The non-empty normalized texts of one or many mentions."""
    return [text for text in (normalize_text(v) for v in as_list(values)) if text]


def entity_map(entities: Any) -> dict[str, Any]:
    """A record's ``entities`` as label -> mentions (a bare label list maps to no mentions)."""
    if entities is None:
        return {}
    if isinstance(entities, Mapping):
        return dict(entities)
    if isinstance(entities, list) and all(isinstance(label, str) for label in entities):
        return dict.fromkeys(entities)  # a label list without mentions (an inference-style schema)
    raise RecordError(f"'entities' must map labels to lists of mentions, got {type(entities).__name__}")


def relation_items(relations: Any) -> Iterable[tuple[str, Any]]:
    """(relation type, fields) for every relation in a record's ``relations`` list."""
    for item in as_list(relations):
        if not isinstance(item, Mapping):
            raise RecordError(f"each relation must be an object {{type: {{head, tail}}}}, got {item!r}")
        yield from item.items()


def relation_tuple(fields: Any) -> tuple[tuple[str, str], ...]:
    """A relation as sorted (field, normalized text) pairs; a (head, tail) pair names its fields."""
    if isinstance(fields, Mapping):
        return tuple(sorted((str(k), normalize_text(v)) for k, v in fields.items()))
    if isinstance(fields, (list, tuple)) and len(fields) == 2:
        return (("head", normalize_text(fields[0])), ("tail", normalize_text(fields[1])))
    raise RecordError(f"a relation must be {{'head': ..., 'tail': ...}} or a (head, tail) pair, got {fields!r}")


def classification(item: Any) -> tuple[str, list[str], list[str], bool]:
    """A gold classification as (task, labels, true labels, multi-label)."""
    if not isinstance(item, Mapping) or "task" not in item or "labels" not in item or "true_label" not in item:
        raise RecordError(f"a classification needs 'task', 'labels' and 'true_label', got {item!r}")
    true_labels = [str(label) for label in as_list(item["true_label"])]
    multi = bool(item.get("multi_label", False)) or len(true_labels) > 1
    return str(item["task"]), [str(label) for label in item["labels"]], true_labels, multi


def predicted_labels(value: Any) -> list[str]:
    """The labels of a predicted classification (items or ``{label: ...}`` dicts)."""
    labels = []
    for item in as_list(value):
        label = item.get("label") if isinstance(item, Mapping) else item
        if label is not None and str(label):
            labels.append(str(label))
    return labels


def structure_items(structures: Any) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """(structure name, field -> value) for every instance in a record's ``json_structures``."""
    for item in as_list(structures):
        if not isinstance(item, Mapping):
            raise RecordError(f"each json_structures entry must be an object {{name: {{field: value}}}}, got {item!r}")
        for name, fields in item.items():
            if not isinstance(fields, Mapping):
                raise RecordError(f"structure {name!r} must map field names to values, got {fields!r}")
            yield name, fields


def is_choice(value: Any) -> bool:
    """A choice field value: ``{"value": ..., "choices": [...]}``."""
    return isinstance(value, Mapping) and "value" in value and "choices" in value


def field_values(instances: Sequence[Mapping[str, Any]], field_name: str) -> list[str]:
    """The normalized texts of one field over all instances of a structure (a choice by its chosen value)."""
    values: list[str] = []
    for instance in instances:
        value: Any = instance.get(field_name)
        values.extend(texts(value["value"] if is_choice(value) else value))
    return values
