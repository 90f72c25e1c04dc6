"""The input of an extraction job: one pass over a JSONL file on any fsspec URL that checks every record, takes its
fingerprint and notes where each chunk of records starts, so a chunk is read later by seeking, never by rereading.

A record is a JSON object with the text under ``"text"`` (or ``"input"``, as in a training file) and optionally
its own ``"schema"`` (a gliner2 ``Schema.from_dict`` dict) or ``"labels"`` (entity labels) and an ``"id"``
copied to its output line; a bare JSON string is a text. Blank lines are skipped. Prefect-free and torch-free.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.storage import resolve

__all__ = ["InputPlan", "Record", "check_labels", "parse_record", "read_chunk", "record_schema", "scan_input"]

TEXT_KEYS = ("text", "input")


@dataclass(frozen=True)
class Record:
    """One input record: its 1-based line number, text, own schema (None: use the job's) and id (None: none)."""

    line: int
    text: str
    schema: dict[str, Any] | None
    id: Any = None


@dataclass(frozen=True)
class InputPlan:
    """What one pass over the input found: its sha256, record count, and each chunk's first byte offset and line."""

    uri: str
    fingerprint: str
    records: int
    records_per_chunk: int
    offsets: tuple[int, ...]
    first_lines: tuple[int, ...]
    without_schema: int  # records carrying neither "schema" nor "labels"
    first_without_schema: int | None  # the line of the first of them

    @property
    def chunks(self) -> int:
        return len(self.offsets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "fingerprint": self.fingerprint,
            "records": self.records,
            "records_per_chunk": self.records_per_chunk,
            "offsets": list(self.offsets),
            "first_lines": list(self.first_lines),
            "without_schema": self.without_schema,
            "first_without_schema": self.first_without_schema,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputPlan:
        return cls(
            uri=str(data["uri"]),
            fingerprint=str(data["fingerprint"]),
            records=int(data["records"]),
            records_per_chunk=int(data["records_per_chunk"]),
            offsets=tuple(int(x) for x in data["offsets"]),
            first_lines=tuple(int(x) for x in data["first_lines"]),
            without_schema=int(data["without_schema"]),
            first_without_schema=data.get("first_without_schema"),
        )


def scan_input(
    uri: str, records_per_chunk: int, check: Callable[[dict[str, Any], str], None] | None = None
) -> InputPlan:
    """Check every record of `uri` (a RecordError names the line and what to fix), hash the bytes, and note where
    every `records_per_chunk`-th record starts. `check(schema, where)` is called on every record's own schema (the
    ONNX runtime's coverage), `where` naming the line."""
    fs, path = resolve(uri)
    if not fs.exists(path) or fs.isdir(path):
        raise RecordError(f"input {uri!r} does not exist or is a directory; pass a JSONL file of texts (path or URL)")
    digest = hashlib.sha256()
    offsets: list[int] = []
    first_lines: list[int] = []
    records = without = 0
    first_without: int | None = None
    offset = 0
    with fs.open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            digest.update(raw)
            if raw.strip():
                record = parse_record(raw, number, uri)
                if records % records_per_chunk == 0:
                    offsets.append(offset)
                    first_lines.append(number)
                records += 1
                if record.schema is None:
                    without += 1
                    first_without = first_without or number
                elif check is not None:
                    check(record.schema, f"{uri} line {number}")
            offset += len(raw)
    if records == 0:
        raise RecordError(f"input {uri!r} holds no records; each line must be a JSON object with a 'text'")
    return InputPlan(
        uri=uri,
        fingerprint=digest.hexdigest(),
        records=records,
        records_per_chunk=records_per_chunk,
        offsets=tuple(offsets),
        first_lines=tuple(first_lines),
        without_schema=without,
        first_without_schema=first_without,
    )


def read_chunk(plan: InputPlan, index: int) -> list[Record]:
    """The records of chunk `index`: read from its offset, `records_per_chunk` of them (fewer in the last)."""
    if not 0 <= index < plan.chunks:
        raise IndexError(f"chunk {index} out of range: the input has {plan.chunks} chunk(s)")
    fs, path = resolve(plan.uri)
    records: list[Record] = []
    with fs.open(path, "rb") as handle:
        handle.seek(plan.offsets[index])
        for number, raw in enumerate(handle, start=plan.first_lines[index]):
            if raw.strip():
                records.append(parse_record(raw, number, plan.uri))
                if len(records) == plan.records_per_chunk:
                    break
    return records


def parse_record(raw: bytes, line: int, uri: str) -> Record:
    """One input line as a Record, or a RecordError naming the line and what is wrong."""
    where = f"{uri} line {line}"
    try:
        item = json.loads(raw)
    except ValueError as exc:
        raise RecordError(f"{where} is not valid JSON ({exc}); each line must be one JSON object") from None
    if isinstance(item, str):
        return Record(line=line, text=item, schema=None)
    if not isinstance(item, Mapping):
        raise RecordError(f"{where}: expected a JSON object with a 'text', got {type(item).__name__}")
    text = next((item[key] for key in TEXT_KEYS if key in item), None)
    if not isinstance(text, str):
        raise RecordError(f"{where}: 'text' must be a string, got {type(text).__name__}")
    return Record(line=line, text=text, schema=record_schema(item, where), id=item.get("id"))


def record_schema(item: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """A record's own schema: its "schema" object, or its "labels" as entities; None when it has neither."""
    if "schema" in item:
        schema = item["schema"]
        if not isinstance(schema, Mapping) or not schema:
            raise RecordError(f'{where}: \'schema\' must be a non-empty object such as {{"entities": ["person"]}}')
        return dict(schema)
    if "labels" in item:
        return {"entities": check_labels(item["labels"], f"{where}: 'labels'")}
    return None


def check_labels(labels: Any, what: str) -> list[str]:
    """A non-empty list of distinct non-empty strings, else a RecordError that says what was given."""
    if (
        not isinstance(labels, list)
        or not labels
        or not all(isinstance(label, str) and label.strip() for label in labels)
        or len(set(labels)) != len(labels)
    ):
        raise RecordError(f"{what} must be a non-empty list of distinct label names, got {labels!r}")
    return list(labels)
