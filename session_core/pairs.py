"""Turning whatever a caller passes as a batch into the native (text, schema) pairs the collator expects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_gliner2.session_core.errors import RecordError

Pair = tuple[str, dict[str, Any]]


def to_pairs(batch: Any) -> list[Pair]:
    """Accept a PlanBatch (anything with `.examples`), or a sequence of native records, InputExample-likes or
    (text, output) pairs."""
    items = getattr(batch, "examples", batch)
    if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise RecordError(
            f"a batch must be a PlanBatch or a list of records, got {type(batch).__name__}; "
            "wrap a single record in a list"
        )
    pairs = [_pair(item, row) for row, item in enumerate(items)]
    if not pairs:
        raise RecordError("the batch is empty; every micro-batch needs at least one record")
    return pairs


def _pair(item: Any, row: int) -> Pair:
    record = item
    if isinstance(item, tuple) and len(item) == 2:
        record = {"input": item[0], "output": item[1]}
    elif not isinstance(record, Mapping):
        to_dict = getattr(record, "to_dict", None)
        if not callable(to_dict):
            raise RecordError(f"batch row {row}: expected a record dict or InputExample, got {type(item).__name__}")
        record = to_dict()
    text, output = record.get("input"), record.get("output")
    if not isinstance(text, str) or not text.strip():
        raise RecordError(f"batch row {row}: 'input' must be a non-empty string")
    if not isinstance(output, Mapping) or not output:
        raise RecordError(f"batch row {row}: 'output' must be a non-empty object of tasks")
    return text, dict(output)
