"""The order in which labels are asked: seeded, per record, the way a user's code would ask them.

A model can tie a label to its place in the prompt. Users ask their labels in their own order, so every number the
product shows (validation, best selection, ``evaluate``, promotion) asks each record's labels in a seeded random
order by default. :func:`shuffle_schema` permutes a ``Schema.from_dict`` schema's entity labels, relation types and
structure fields; the permutation depends only on ``(seed, trial, position)`` (a record's position in its data set),
so the same record is asked the same way on every run, resume and machine. ``trial`` numbers the K orders a spread
is measured over; trial 0 is the default shuffled order.

Torch-free and numpy-free: the stream is :class:`random.Random` seeded from a BLAKE2b digest.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

from prefect_gliner2.session_core.scoring import DatasetSchema, inference_schema

__all__ = ["CANONICAL", "LABEL_ORDERS", "SHUFFLED", "extraction_schemas", "order_rng", "shuffle_schema"]

SHUFFLED = "shuffled"  # each record's labels in a seeded random order (the default everywhere)
CANONICAL = "canonical"  # the data set's own order (see scoring.data_order): the order training records list
LABEL_ORDERS = (SHUFFLED, CANONICAL)


def order_rng(seed: int, position: int, trial: int = 0, *, purpose: str = "label-order") -> random.Random:
    """A private random stream for one record: the same (purpose, seed, trial, position) gives the same stream."""
    digest = hashlib.blake2b(f"{purpose}:{seed}:{trial}:{position}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def shuffle_schema(schema: Mapping[str, Any], *, seed: int, position: int, trial: int = 0) -> dict[str, Any]:
    """A copy of `schema` with its entity labels, relation types and each structure's fields in a seeded random
    order. Classification tasks keep their order (their labels are scored as a set). Descriptions and per-label
    settings move with their labels."""
    rng = order_rng(seed, position, trial)
    out = dict(schema)
    if "entities" in out:
        out["entities"] = _shuffled(out["entities"], rng)
    if "relations" in out:
        out["relations"] = _shuffled(out["relations"], rng)
    if "structures" in out:
        out["structures"] = {name: _structure(spec, rng) for name, spec in out["structures"].items()}
    return out


def extraction_schemas(
    outputs: Sequence[Mapping[str, Any]], *, label_order: str = SHUFFLED, seed: int = 0, trial: int = 0
) -> list[dict[str, Any]]:
    """The schema each gold output is extracted with (the data set's labels, see ``scoring.inference_schema``), its
    labels in the record's seeded random order (``label_order="shuffled"``) or the data set's own."""
    if label_order not in LABEL_ORDERS:
        raise ValueError(f"label_order must be one of {list(LABEL_ORDERS)}, got {label_order!r}")
    dataset = DatasetSchema.of(outputs)
    schemas = [inference_schema(output, dataset) for output in outputs]
    if label_order == SHUFFLED:
        schemas = [shuffle_schema(s, seed=seed, position=i, trial=trial) for i, s in enumerate(schemas)]
    return schemas


def _shuffled(items: Any, rng: random.Random) -> Any:
    if isinstance(items, Mapping):
        keys = list(items)
        rng.shuffle(keys)
        return {key: items[key] for key in keys}
    if isinstance(items, Sequence) and not isinstance(items, (str, bytes)):
        copy = list(items)
        rng.shuffle(copy)
        return copy
    return items


def _structure(spec: Any, rng: random.Random) -> Any:
    if isinstance(spec, Mapping) and "fields" in spec:
        return {**spec, "fields": _shuffled(spec["fields"], rng)}
    return _shuffled(spec, rng)
