"""Label confusion: how many of a label's false positives are gold items of another label in the same record.

A model that tags a city as a person makes one false positive for person and one false negative for city; micro F1
shows neither as confusion. Here, per record, an entity mention predicted for a label that is not gold for it but is
gold for another label of the record (same normalized text, different label) counts for the predicted label, in
total and per other label; relations the same by their (field, text) tuples. :func:`scoring.score_records` sums
these into ``ScoreReport.confused`` and ``confused_with`` (the per-label rows' ``confused`` and ``confused_with``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.native_payloads import (
    RELATION_KEY,
    as_list,
    entity_map,
    relation_items,
    relation_tuple,
    texts,
)

__all__ = ["confusions"]

Confusion = tuple[tuple[str, str], int, dict[str, int]]


def confusions(
    gold: Mapping[str, Any], predicted: Mapping[str, Any], entities: Sequence[str], relations: Sequence[str]
) -> Iterable[Confusion]:
    """``((kind, label), confused, {other label: n})`` for each entity label and relation type of the data set
    whose false positives in this record include gold items of another label (``confused`` counts an item gold
    for two other labels once; the per-label counts count it for each)."""
    gold_entities = entity_map(gold.get("entities"))
    predicted_entities = entity_map(predicted.get("entities"))
    by_entity = {label: (texts(gold_entities.get(label)), texts(predicted_entities.get(label))) for label in entities}
    gold_relations: dict[str, list[Any]] = {}
    for name, fields in relation_items(gold.get("relations")):
        gold_relations.setdefault(name, []).append(relation_tuple(fields))
    predicted_relations = predicted.get(RELATION_KEY) or {}
    by_relation = {
        name: (gold_relations.get(name, []), [relation_tuple(i) for i in as_list(predicted_relations.get(name))])
        for name in relations
    }
    yield from _of_kind("entities", by_entity)
    yield from _of_kind("relations", by_relation)


def _of_kind(kind: str, items: Mapping[str, tuple[Sequence[Hashable], Sequence[Hashable]]]) -> Iterable[Confusion]:
    gold_of = {label: Counter(gold) for label, (gold, _) in items.items()}
    for label, (_, predicted) in items.items():
        wrong = Counter(predicted) - gold_of[label]
        if not wrong:
            continue
        others = {o: n for o in gold_of if o != label and (n := sum((wrong & gold_of[o]).values()))}
        if others:
            elsewhere = sum((gold_of[o] for o in others), Counter())
            yield (kind, label), sum((wrong & elsewhere).values()), others
