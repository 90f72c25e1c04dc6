"""Counts of every label at every candidate threshold, from one extraction with confidences (what a fit reads).

The model extracts every validation record once, at :data:`FLOOR` and with confidences. A prediction survives
threshold ``t`` when its confidence is ``>= t`` (a relation when both its head and tail do, since gliner2 applies a
relation's threshold to both fields), so the predictions at every candidate value come from that one extraction
(:func:`with_threshold`). Candidates are :data:`GRID` (0.05 to 0.95 by 0.05, 0.5 included).

:class:`ThresholdTable` keeps each record's counts per (kind, label) at every grid value, so a fit can sum them over
all records or over a part of them (cross-fitting). Entities (per label), relations (per type) and structure fields
(``"structure.field"``) have thresholds; classification counts do not depend on the span threshold and are kept as
extracted. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.scoring import RELATION_KEY, Counts, DatasetSchema, score_records
from prefect_gliner2.session_core.thresholds import Thresholds

__all__ = ["FLOOR", "GRID", "KIND_OF", "LabelKey", "ThresholdTable", "label_name", "with_threshold"]

GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, 0.10, ..., 0.95
FLOOR = GRID[0]  # the one extraction's threshold: every candidate's predictions are a subset of it
KIND_OF = {"entities": "entities", "relations": "relations", "structures": "fields"}  # scoring kind -> Thresholds
LabelKey = tuple[str, str]


def label_name(key: LabelKey) -> str:
    """``kind/label`` as reports and export.json name a label (``entities/city``, ``structures/order.id``)."""
    return f"{key[0]}/{key[1]}"


@dataclass(frozen=True)
class ThresholdTable:
    """Per record: the counts of each thresholded label at every grid value, and the counts no threshold changes."""

    labels: tuple[LabelKey, ...]  # the thresholded labels, in (kind, label) order
    rows: tuple[Mapping[LabelKey, tuple[Counts, ...]], ...]  # record -> label -> counts at GRID[i]
    fixed_rows: tuple[Mapping[LabelKey, Counts], ...]  # record -> its classification counts per task

    @classmethod
    def of(cls, gold: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]) -> ThresholdTable:
        """The table of gold outputs and the payloads extracted for them with confidences at :data:`FLOOR`."""
        dataset = DatasetSchema.of(gold)
        structures = list(dataset.structures)
        reports = [
            score_records(
                gold,
                [with_threshold(p, Thresholds(threshold=t), structures) for p in predictions],
                dataset,
                per_record=True,
            )
            for t in GRID
        ]
        labels = tuple(sorted(key for key in reports[0].labels if key[0] in KIND_OF))
        per_record = [report.per_record or [] for report in reports]
        rows = tuple(
            {key: tuple(per_record[i][r].get(key, Counts()) for i in range(len(GRID))) for key in labels}
            for r in range(len(gold))
        )
        fixed = tuple({k: c for k, c in per_record[0][r].items() if k[0] not in KIND_OF} for r in range(len(gold)))
        return cls(labels, rows, fixed)

    @property
    def records(self) -> int:
        return len(self.rows)

    def counts(self, records: Iterable[int] | None = None) -> dict[LabelKey, list[Counts]]:
        """Each label's counts at every grid value, summed over `records` (indices; all records when None)."""
        chosen = range(len(self.rows)) if records is None else records
        out = {key: [Counts()] * len(GRID) for key in self.labels}
        for r in chosen:
            row = self.rows[r]
            for key in self.labels:
                out[key] = [a + b for a, b in zip(out[key], row[key], strict=True)]
        return out

    def fixed_labels(self, records: Iterable[int] | None = None) -> dict[LabelKey, Counts]:
        """Each classification task's counts, summed over `records` (all when None)."""
        chosen = range(len(self.rows)) if records is None else records
        out: dict[LabelKey, Counts] = {}
        for r in chosen:
            for key, counts in self.fixed_rows[r].items():
                out[key] = out.get(key, Counts()) + counts
        return out

    def fixed(self, records: Iterable[int] | None = None) -> Counts:
        """The classification counts of all tasks, summed over `records` (all when None)."""
        return sum(self.fixed_labels(records).values(), Counts())


def with_threshold(
    prediction: Mapping[str, Any], thresholds: Thresholds, structures: Sequence[str] = ()
) -> dict[str, Any]:
    """A payload extracted with confidences at a lower threshold, as if extracted with `thresholds`: entity
    mentions, relations (head and tail) and the field values of the `structures` named whose confidence is below
    their label's value are dropped. Classifications are kept as they are."""
    out = dict(prediction)
    entities = prediction.get("entities")
    if isinstance(entities, Mapping):
        out["entities"] = {
            label: [m for m in _items(mentions) if _kept(m, thresholds.for_label("entities", label))]
            for label, mentions in entities.items()
        }
    relations = prediction.get(RELATION_KEY)
    if isinstance(relations, Mapping):
        out[RELATION_KEY] = {
            name: [r for r in _items(items) if _relation_kept(r, thresholds.for_label("relations", name))]
            for name, items in relations.items()
        }
    return _structures_with_threshold(out, structures, thresholds)


def _structures_with_threshold(
    prediction: dict[str, Any], names: Sequence[str], thresholds: Thresholds
) -> dict[str, Any]:
    for name in names:
        instances = prediction.get(name)
        if not isinstance(instances, list):
            continue
        prediction[name] = [
            {
                field: _field_kept(value, thresholds.for_label("fields", f"{name}.{field}"))
                for field, value in instance.items()
            }
            if isinstance(instance, Mapping)
            else instance
            for instance in instances
        ]
    return prediction


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else ([] if value is None else [value])


def _confidence(item: Any) -> float:
    """An item's confidence; an item without one (a plain string) counts as certain."""
    if isinstance(item, Mapping) and isinstance(item.get("confidence"), (int, float)):
        return float(item["confidence"])
    return 1.0


def _kept(item: Any, threshold: float) -> bool:
    return _confidence(item) >= threshold


def _relation_kept(item: Any, threshold: float) -> bool:
    if isinstance(item, Mapping) and "head" in item and "tail" in item:
        return _kept(item["head"], threshold) and _kept(item["tail"], threshold)
    return _kept(item, threshold)


def _field_kept(value: Any, threshold: float) -> Any:
    if isinstance(value, list):
        return [v for v in value if _kept(v, threshold)]
    if value is None or _kept(value, threshold):
        return value
    return None
