"""Fitting extraction thresholds on validation data: the global value and per-label values that maximise micro F1.

The model extracts every validation record once, at a low floor threshold and with confidences, each record's labels
asked in the seeded shuffled order the product scores with (``label_order.shuffle_schema``, trial 0). A prediction
survives threshold ``t`` when its confidence is ``>= t`` (a relation when both its head and tail do, since gliner2
applies a relation's threshold to both fields), so the predictions at every candidate value come from that one
extraction. Candidates are the grid :data:`GRID` (0.05 to 0.95 by 0.05, 0.5 included, so the fitted F1 is never
below the F1 at gliner2's default 0.5).

1. The global threshold is the grid value with the highest micro F1 over all labels (:mod:`.scoring`'s rules);
   ties go to the value nearest 0.5, then to the lower one.
2. Then each label with at least ``min_support`` gold items (:data:`MIN_SUPPORT`), in (kind, label) order, gets the
   grid value that maximises the micro F1 of all labels with the others fixed at their values so far; ties go to
   the global value (a label keeps it unless another value is strictly better), then nearest 0.5, then the lower.
   Every step keeps or raises micro F1. Labels with less support use the global value.

Entities (per label), relations (per type) and structure fields (``"structure.field"``) are fitted; classification
counts do not depend on the span threshold and are scored as extracted. Deterministic; torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.label_order import SHUFFLED
from prefect_gliner2.session_core.scoring import RELATION_KEY, Counts, DatasetSchema, score_records
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, Thresholds

__all__ = ["FLOOR", "GRID", "MIN_SUPPORT", "fit_thresholds", "fit_with_model", "with_threshold"]

GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, 0.10, ..., 0.95
FLOOR = GRID[0]  # the one extraction's threshold: every candidate's predictions are a subset of it
MIN_SUPPORT = 10  # gold items a label needs for a value of its own
KIND_OF = {"entities": "entities", "relations": "relations", "structures": "fields"}  # scoring kind -> Thresholds
LabelKey = tuple[str, str]
ExtractWithConfidence = Callable[[list[str], list[dict[str, Any]], float], list[dict[str, Any]]]


@dataclass(frozen=True)
class _Table:
    """Counts per label at each grid value, and the counts no threshold changes (classifications)."""

    counts: dict[LabelKey, list[Counts]]  # label -> counts at GRID[i]
    fixed: Counts
    support: dict[LabelKey, int]


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


def _table(gold: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]) -> _Table:
    dataset = DatasetSchema.of(gold)
    structures = list(dataset.structures)
    reports = [
        score_records(gold, [with_threshold(p, Thresholds(threshold=t), structures) for p in predictions], dataset)
        for t in GRID
    ]
    fitted = {key: [r.labels.get(key, Counts()) for r in reports] for key in reports[0].labels if key[0] in KIND_OF}
    fixed = reports[0].total("classifications")
    support = {key: counts[0].support for key, counts in fitted.items()}
    return _Table(fitted, fixed, support)


def _best(scores: Sequence[float], preferred: float) -> float:
    """The grid value with the highest score; ties to the value nearest `preferred`, then nearest 0.5, then lower."""
    top = max(scores)
    tied = [GRID[i] for i, s in enumerate(scores) if s == top]
    return min(tied, key=lambda t: (abs(t - preferred), abs(t - DEFAULT_THRESHOLD), t))


def _micro_f1(table: _Table, choice: Mapping[LabelKey, int]) -> float:
    total = table.fixed
    for key, counts in table.counts.items():
        total = total + counts[choice[key]]
    return total.f1


def fit_thresholds(
    gold: Sequence[Mapping[str, Any]],
    predictions: Sequence[Mapping[str, Any]],
    *,
    min_support: int = MIN_SUPPORT,
) -> Thresholds:
    """Thresholds fitted on gold outputs and the payloads extracted for them with confidences at :data:`FLOOR` or
    lower (see the module docstring for the rule). ``details`` records the records, ``min_support``, the micro F1 at
    the fitted values (``f1``), at the fitted global value alone (``f1_global``) and at 0.5 (``f1_default``)."""
    table = _table(gold, predictions)
    at = {t: i for i, t in enumerate(GRID)}
    default = at[DEFAULT_THRESHOLD]
    global_scores = [_micro_f1(table, dict.fromkeys(table.counts, i)) for i in range(len(GRID))]
    threshold = _best(global_scores, DEFAULT_THRESHOLD)
    choice = dict.fromkeys(table.counts, at[threshold])
    per_label: dict[str, dict[str, float]] = {kind: {} for kind in KIND_OF.values()}
    for key in sorted(k for k in table.counts if table.support[k] >= min_support):
        scores = [_micro_f1(table, {**choice, key: i}) for i in range(len(GRID))]
        value = _best(scores, threshold)
        choice[key] = at[value]
        per_label[KIND_OF[key[0]]][key[1]] = value
    details = {
        "records": len(gold),
        "min_support": min_support,
        "label_order": SHUFFLED,
        "f1": _micro_f1(table, choice),
        "f1_global": global_scores[at[threshold]],
        "f1_default": global_scores[default],
        "support": {f"{kind}/{label}": n for (kind, label), n in sorted(table.support.items())},
    }
    return Thresholds(threshold=threshold, **per_label, fitted=True, details=details)


def fit_with_model(
    pairs: Sequence[tuple[str, Mapping[str, Any]]],
    extract: ExtractWithConfidence,
    *,
    seed: int,
    min_support: int = MIN_SUPPORT,
) -> Thresholds:
    """Extract the (text, gold output) `pairs` once at :data:`FLOOR` with confidences (`extract(texts, schemas,
    threshold)`), each record's labels in its seeded shuffled order, and fit on the result."""
    from prefect_gliner2.session_core.evaluation import extraction_schemas

    outputs = [output for _, output in pairs]
    schemas = extraction_schemas(outputs, label_order=SHUFFLED, seed=seed)
    predictions = extract([text for text, _ in pairs], schemas, FLOOR)
    return fit_thresholds(outputs, predictions, min_support=min_support)
