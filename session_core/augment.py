"""Plan-level label augmentation: negative labels (asked with an empty answer) and label subsets (asked alone).

Negative labels. A model trained only on the labels each record happens to list never learns to answer "none" for
a label it is asked about; users ask their whole label set of every text. With ``negative_label_prob`` p, each entity
label of the data set that a record's ``entities`` task does not name is added to that record's task with an empty
mention list, with probability p, independently per (plan seed, epoch, record position): the same batch of a plan
always holds the same records, on every run, resume and machine (no stream state to checkpoint). Records without an
entity task are left alone (asking them entities would add a task they were not annotated for).

Label subsets. gliner2 reads a label's representation at the ``[E]`` marker before the label's name, so the label's
identity reaches the model only through the encoder's attention from that marker to the name. When every record
asks the same labels (a fixed label set, negatives filling in the rest) and their order is shuffled per occurrence,
every ``[E]`` of a prompt sees the same words, so nothing tells one label's marker from another's: the heads settle
on one label-agnostic detector that tags every mention with every label (the two-label case of issue 43: F1 0.667),
and an encoder whose attention does not yet carry the name to its marker (a fresh encoder, new heads) never learns
to. A prompt that asks only some of the labels does carry the names' content to the marker (the bag of words
differs between prompts); once the heads read it, the shuffled full prompts teach the encoder to attend to the
adjacent name (order robustness). So with ``label_subset_prob`` p, during the first ``label_subset_until`` fraction
of a plan's epochs, each record whose ``entities`` task asks two or more labels (its own and its negatives) is asked
a random proper non-empty subset of them instead, with probability p; the mentions of the labels left out are then
plain text for that record. Later epochs ask every label. The draw depends only on (plan seed, epoch, record
position), like the negatives.

Label order within a record is gliner2's to shuffle (``SamplingConfig.shuffle_entities``, see the engine); the
negatives are appended after the record's own labels. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.label_order import order_rng

__all__ = ["entity_label_set", "label_subset_probability", "with_label_subset", "with_negative_labels"]


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


def label_subset_probability(probability: float, until: float, epoch: int, num_epochs: int) -> float:
    """The label-subset probability of 0-based `epoch` of `num_epochs`: `probability` while ``epoch < until *
    num_epochs``, then 0 (see the module docstring)."""
    return float(probability) if epoch < float(until) * num_epochs else 0.0


def with_label_subset(
    example: dict[str, Any], probability: float, *, seed: int, epoch: int, row: int
) -> dict[str, Any]:
    """`example` asking a random proper non-empty subset of its entity labels, with `probability` (see the module
    docstring); the example itself when it keeps all of them."""
    output = example.get("output")
    entities = output.get("entities") if isinstance(output, Mapping) else None
    if probability <= 0.0 or not isinstance(entities, Mapping) or len(entities) < 2:
        return example
    rng = order_rng(seed, row, epoch, purpose="label-subset")
    if rng.random() >= probability:
        return example
    labels = list(entities)
    kept = set(rng.sample(labels, rng.randint(1, len(labels) - 1)))
    assert isinstance(output, Mapping)
    return {**example, "output": {**output, "entities": {k: v for k, v in entities.items() if k in kept}}}
