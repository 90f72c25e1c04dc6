"""The plan's row orders: its own deterministic random stream, each epoch's shuffle, and length grouping (torch-free).

The algorithm (and its version, ``PLAN_ALGORITHM_VERSION``) is specified in ``plan``'s module docstring: "Random
stream", "Row order" and "Length grouping" are implemented here.
"""

from __future__ import annotations

import hashlib
import sys
from array import array

__all__ = ["PLAN_ALGORITHM_VERSION", "group_by_length", "random_keys", "shuffled"]

PLAN_ALGORITHM_VERSION = 3


def shuffled(count: int, seed: int, epoch: int, purpose: str) -> list[int]:
    """``0..count-1`` sorted by the top 53 bits of their keys (floats compare fastest), ties by position."""
    keys = [float(key >> 11) for key in random_keys(seed, epoch, purpose, count)]
    return sorted(range(count), key=keys.__getitem__)


def random_keys(seed: int, epoch: int, purpose: str, count: int) -> array:
    """``count`` uint64 keys of the plan's own deterministic stream (see the module docstring)."""
    # the stream's name keeps "v1": v2 changed what a batch holds (negative labels), not the row order
    label = f"prefect-gliner2/plan/v1/{purpose}/seed={seed}/epoch={epoch}".encode("ascii")
    keys = array("Q", hashlib.shake_256(label).digest(8 * count) if count else b"")
    if sys.byteorder == "big":
        keys.byteswap()
    return keys


def group_by_length(
    order: list[int], lengths: array, batch_size: int, window_batches: int, seed: int, epoch: int
) -> list[int]:
    """`order` length-grouped: windows of `window_batches` batches, each stably sorted by text length and cut into
    batches; the full batches reordered by the plan's stream, the partial batch (of the last window) last."""
    window = batch_size * window_batches
    full: list[list[int]] = []
    partial: list[int] = []
    for start in range(0, len(order), window):
        group = order[start : start + window]
        group.sort(key=lengths.__getitem__)
        for offset in range(0, len(group), batch_size):
            chunk = group[offset : offset + batch_size]
            if len(chunk) == batch_size:
                full.append(chunk)
            else:
                partial = chunk
    return [row for k in shuffled(len(full), seed, epoch, "batches") for row in full[k]] + partial
