"""Extraction quality: compare predicted and gold native records and count tp/fp/fn per task kind and label.

Pure Python (no torch, no gliner2): unit-testable on hand-made records. Gold is a native record's ``output``
(``entities``, ``relations``, ``classifications``, ``json_structures``); a prediction is gliner2's formatted
extraction payload for the schema :func:`inference_schema` builds from the same gold. Reading both (and
``normalize_text``) is :mod:`.native_payloads`.

Matching rules (docs/evaluation.md, "Extraction metrics"):

- Texts match exactly after whitespace normalization (leading/trailing whitespace removed, inner runs of whitespace
  collapsed to one space). Case matters. A mention given as a span dict counts by its ``text``.
- Entities: per label, the multiset of mention texts. A mention listed twice counts twice; overlapping or nested
  spans get no partial credit ("Alice" for gold "Alice Smith" is one false positive and one false negative).
- Relations: per relation type, the multiset of (field, text) tuples, ``head`` and ``tail`` for the usual relation.
- Classifications: per task, the set of predicted labels against the set of true labels (single- and multi-label).
- Structures: per ``structure.field``, the multiset of values over all instances of the structure in the record
  (choice fields by their chosen value); which instance a value belongs to is not scored.
- Labels come from the evaluated data set as a whole (:class:`DatasetSchema`): a record is asked for every entity
  label, relation type and structure seen anywhere in the data, so extracting a label the record does not list is a
  false positive, in the order the records list them (:func:`data_order`). A classification task is scored only
  on records that carry it.
- Empty counts give 0.0, never NaN: precision with nothing predicted, recall with nothing to find, F1 when both are 0.
  Micro P/R/F1 sum the counts; macro F1 is the mean F1 over labels with any gold or predicted item.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.metrics import KIND_F1_KEYS
from prefect_gliner2.session_core.native_payloads import (
    as_list,
    classification,
    entity_map,
    field_values,
    is_choice,
    normalize_text,
    predicted_labels,
    relation_items,
    relation_tuple,
    structure_items,
    texts,
)

__all__ = [
    "KINDS",
    "Counts",
    "DatasetSchema",
    "ScoreReport",
    "inference_schema",
    "data_order",
    "normalize_text",
    "score_records",
]

KINDS: tuple[str, ...] = ("entities", "relations", "classifications", "structures")
RELATION_KEY = "relation_extraction"  # where gliner2's formatted payload puts relations
LabelKey = tuple[str, str]  # (kind, label)


@dataclass(frozen=True)
class Counts:
    """True positives, false positives and false negatives of one label (or a sum of labels)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    @property
    def support(self) -> int:
        """How many gold items there were."""
        return self.tp + self.fn

    @property
    def predicted(self) -> int:
        return self.tp + self.fp

    @property
    def precision(self) -> float:
        return self.tp / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.tp / self.support if self.support else 0.0

    @property
    def f1(self) -> float:
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else 0.0

    @classmethod
    def of(cls, gold: Iterable[Any], predicted: Iterable[Any]) -> Counts:
        """Multiset comparison of two collections of hashable items."""
        g, p = Counter(gold), Counter(predicted)
        tp = sum((g & p).values())
        return cls(tp, sum(p.values()) - tp, sum(g.values()) - tp)


@dataclass
class ScoreReport:
    """Counts per (kind, label), with micro/macro summaries and a table for people."""

    labels: dict[LabelKey, Counts] = field(default_factory=dict)
    records: int = 0
    per_record: list[dict[LabelKey, Counts]] | None = None  # each record's own counts (score_records' per_record)

    def add(self, key: LabelKey, counts: Counts) -> None:
        self.labels[key] = self.labels.get(key, Counts()) + counts

    def total(self, kind: str | None = None) -> Counts:
        """Summed counts over all labels, or over the labels of one task kind."""
        out = Counts()
        for (k, _), counts in self.labels.items():
            if kind is None or k == kind:
                out = out + counts
        return out

    @property
    def macro_f1(self) -> float:
        scored = [c.f1 for c in self.labels.values() if c.support or c.predicted]
        return sum(scored) / len(scored) if scored else 0.0

    def metrics(self) -> dict[str, float]:
        """The validation metrics (names from :mod:`.metrics`)."""
        total = self.total()
        out = {"eval_precision": total.precision, "eval_recall": total.recall, "eval_f1": total.f1}
        out.update({key: self.total(kind).f1 for kind, key in KIND_F1_KEYS.items()})
        out["eval_macro_f1"] = self.macro_f1
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per label (kind, label, precision, recall, f1, support, tp, fp, fn), in kind then label order."""
        order = {kind: i for i, kind in enumerate(KINDS)}
        keys = sorted(self.labels, key=lambda key: (order[key[0]], key[1]))
        return [_row(kind, label, self.labels[(kind, label)]) for kind, label in keys]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: metrics, totals and the per-label rows."""
        total = self.total()
        return {
            "records": self.records,
            "metrics": self.metrics(),
            "total": _row("all", "all", total),
            "per_label": self.rows(),
        }


def _row(kind: str, label: str, counts: Counts) -> dict[str, Any]:
    return {
        "kind": kind,
        "label": label,
        "precision": counts.precision,
        "recall": counts.recall,
        "f1": counts.f1,
        "support": counts.support,
        "tp": counts.tp,
        "fp": counts.fp,
        "fn": counts.fn,
    }


# ------------------------------------------------------------------------------------------- the data set's schema


@dataclass
class DatasetSchema:
    """Every entity label, relation type and structure (with its fields) in a set of gold outputs, first-seen order."""

    entities: dict[str, str] = field(default_factory=dict)  # label -> description ("" when none)
    relations: list[str] = field(default_factory=list)
    structures: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # name -> field -> settings

    @classmethod
    def of(cls, outputs: Sequence[Mapping[str, Any]]) -> DatasetSchema:
        """Labels in the data's own order (see :func:`data_order`): gliner2 does not shuffle entity labels while
        training, so a model may tie a label to its place in the prompt and must be asked in the order it learned."""
        schema = cls()
        entity_orders: list[list[str]] = []
        relation_orders: list[list[str]] = []
        for row, output in enumerate(outputs):
            if not isinstance(output, Mapping):
                raise RecordError(f"gold row {row}: 'output' must be an object of tasks, got {type(output).__name__}")
            schema._add(output)
            entity_orders.append(list(entity_map(output.get("entities"))))
            relation_orders.append(list(dict.fromkeys(name for name, _ in relation_items(output.get("relations")))))
        schema.entities = {label: schema.entities[label] for label in data_order(entity_orders)}
        schema.relations = data_order(relation_orders)
        return schema

    def _add(self, output: Mapping[str, Any]) -> None:
        descriptions = output.get("entity_descriptions") or {}
        for label in entity_map(output.get("entities")):
            if label not in self.entities or (not self.entities[label] and descriptions.get(label)):
                self.entities[label] = str(descriptions.get(label) or "")
        for name, _ in relation_items(output.get("relations")):
            if name not in self.relations:
                self.relations.append(name)
        for name, fields in structure_items(output.get("json_structures")):
            known = self.structures.setdefault(name, {})
            for field_name, value in fields.items():
                entry = known.setdefault(field_name, {"dtype": "str", "choices": None})
                if isinstance(value, list):
                    entry["dtype"] = "list"
                if is_choice(value):
                    entry["choices"] = list(dict.fromkeys([*(entry["choices"] or []), *value["choices"]]))


def data_order(sequences: Sequence[Sequence[str]]) -> list[str]:
    """One order of all labels that keeps every record's own order where the records agree: a label listed before
    another in some record comes first; ties, and contradicting records, are settled by first appearance."""
    first: dict[str, int] = {}
    after: dict[str, set[str]] = {}
    for sequence in sequences:
        for label in sequence:
            first.setdefault(label, len(first))
            after.setdefault(label, set())
        for earlier, later in zip(sequence, sequence[1:], strict=False):
            after[earlier].add(later)
    disputed = {(a, b) for a, laters in after.items() for b in laters if a in after[b]}
    for a, b in disputed:  # records that disagree about a pair leave that pair unordered
        after[a].discard(b)
    before_count = {label: 0 for label in first}
    for label in first:
        for later in after[label]:
            before_count[later] += 1
    order: list[str] = []
    remaining = set(first)
    while remaining:
        ready = [label for label in remaining if before_count[label] == 0] or list(remaining)  # a longer cycle
        label = min(ready, key=first.__getitem__)
        order.append(label)
        remaining.discard(label)
        for later in after[label]:
            before_count[later] -= 1
    return order


def inference_schema(output: Mapping[str, Any], dataset: DatasetSchema) -> dict[str, Any]:
    """The schema to extract a gold record with: a dict for gliner2's ``Schema.from_dict`` (data-set wide labels,
    the record's own classification tasks)."""
    schema: dict[str, Any] = {}
    if dataset.entities:
        schema["entities"] = dict(dataset.entities) if any(dataset.entities.values()) else list(dataset.entities)
    if dataset.relations:
        schema["relations"] = list(dataset.relations)
    tasks = [classification(item) for item in output.get("classifications") or []]
    if tasks:
        schema["classifications"] = [
            {"task": task, "labels": labels, "multi_label": multi} for task, labels, _, multi in tasks
        ]
    if dataset.structures:
        schema["structures"] = {
            name: {"fields": [{"name": f, **_field_settings(s)} for f, s in fields.items()]}
            for name, fields in dataset.structures.items()
        }
    return schema


def _field_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"dtype": settings["dtype"]}
    if settings.get("choices"):
        out["choices"] = list(settings["choices"])
    return out


# ------------------------------------------------------------------------------------------------------- scoring


def score_records(
    gold_outputs: Sequence[Mapping[str, Any]],
    predictions: Sequence[Mapping[str, Any]],
    dataset: DatasetSchema | None = None,
    *,
    per_record: bool = False,
) -> ScoreReport:
    """Score predicted payloads against gold outputs, record by record (same order, same length). With
    ``per_record`` the report also keeps each record's counts per (kind, label) (``ScoreReport.per_record``, the
    input of a paired comparison: :class:`~prefect_gliner2.session_core.record_counts.RecordCounts`)."""
    if len(gold_outputs) != len(predictions):
        raise RecordError(
            f"{len(predictions)} predictions for {len(gold_outputs)} gold records; pass one prediction per record"
        )
    schema = dataset if dataset is not None else DatasetSchema.of(gold_outputs)
    report = ScoreReport(records=len(gold_outputs), per_record=[] if per_record else None)
    for row, (gold, predicted) in enumerate(zip(gold_outputs, predictions, strict=True)):
        if not isinstance(predicted, Mapping):
            raise RecordError(f"prediction {row} must be an object (gliner2's payload), got {type(predicted).__name__}")
        own: dict[LabelKey, Counts] = {}
        for key, counts in _score_one(gold, predicted, schema):
            report.add(key, counts)
            own[key] = own.get(key, Counts()) + counts
        if report.per_record is not None:
            report.per_record.append(own)
    return report


def _score_one(
    gold: Mapping[str, Any], predicted: Mapping[str, Any], schema: DatasetSchema
) -> Iterable[tuple[LabelKey, Counts]]:
    gold_entities = entity_map(gold.get("entities"))
    predicted_entities = entity_map(predicted.get("entities"))
    for label in schema.entities:
        yield ("entities", label), Counts.of(texts(gold_entities.get(label)), texts(predicted_entities.get(label)))
    gold_relations: dict[str, list[Any]] = {}
    for name, fields in relation_items(gold.get("relations")):
        gold_relations.setdefault(name, []).append(relation_tuple(fields))
    predicted_relations = predicted.get(RELATION_KEY) or {}
    for name in schema.relations:
        items = [relation_tuple(item) for item in as_list(predicted_relations.get(name))]
        yield ("relations", name), Counts.of(gold_relations.get(name, []), items)
    for task, _, true_labels, _ in (classification(item) for item in gold.get("classifications") or []):
        yield ("classifications", task), Counts.of(set(true_labels), set(predicted_labels(predicted.get(task))))
    gold_structures = list(structure_items(gold.get("json_structures")))
    for name, fields in schema.structures.items():
        gold_instances = [values for struct, values in gold_structures if struct == name]
        predicted_instances = [item for item in as_list(predicted.get(name)) if isinstance(item, Mapping)]
        for field_name in fields:
            yield (
                ("structures", f"{name}.{field_name}"),
                Counts.of(field_values(gold_instances, field_name), field_values(predicted_instances, field_name)),
            )
