"""Negative labels: entity labels of the training data that a record does not list, asked with an empty answer.

A model trained only on the labels each record happens to list never learns to answer "none" for a label it is asked
about; users ask their whole label set of every text. With ``negative_label_prob`` p, each entity label of the data
set that a record's ``entities`` task does not name is added to that record's task with an empty mention list, with
probability p, independently per (plan seed, epoch, record position): the same batch of a plan always holds the same
records, on every run, resume and machine (no stream state to checkpoint). Records without an entity task are left
alone (asking them entities would add a task they were not annotated for).

Label order within a record is gliner2's to shuffle (``SamplingConfig.shuffle_entities``, see the engine); the
negatives are appended after the record's own labels. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.label_order import order_rng

__all__ = ["entity_label_set", "with_negative_labels"]


def entity_label_set(examples: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every entity label named by the records' ``entities`` tasks, in first-seen order."""
    seen: dict[str, None] = {}
    for example in examples:
        entities = (example.get("output") or {}).get("entities")
        if isinstance(entities, Mapping):
            seen.update(dict.fromkeys(str(label) for label in entities))
    return tuple(seen)


def with_negative_labels(
    example: dict[str, Any], labels: Sequence[str], probability: float, *, seed: int, epoch: int, row: int
) -> dict[str, Any]:
    """`example` with some of the labels it does not list added as empty answers (see the module docstring); the
    example itself when nothing is added."""
    output = example.get("output")
    entities = output.get("entities") if isinstance(output, Mapping) else None
    if probability <= 0.0 or not isinstance(entities, Mapping):
        return example
    missing = [label for label in labels if label not in entities]
    if not missing:
        return example
    rng = order_rng(seed, row, epoch, purpose="negative-labels")
    chosen = [label for label in missing if rng.random() < probability]
    if not chosen:
        return example
    assert isinstance(output, Mapping)
    return {**example, "output": {**output, "entities": {**entities, **{label: [] for label in chosen}}}}
