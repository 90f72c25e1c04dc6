"""Loading training records: read, convert and validate GLiNER2 examples into a RecordSet, without importing gliner2.

Accepted inputs (``load_records``): a JSONL path or fsspec URL (or a list of them; compression is inferred
from the extension), a list of native dicts ``{"input": text, "output": {...}}``, the native loader's
alternatives ``{"text": ..., "schema": {...}}`` and ``{"text": ..., "entities"/"classifications"/"relations"/
"json_structures": ...}``, and InputExample-like objects (anything with ``to_dict()``; gliner2 itself is never
imported because it imports torch).

Every record becomes the dict ``{"input": text, "output": {...}}`` in its canonical form (``canonical``: record JSON,
key order kept, and its sha256 content hash). Validation mirrors the structural checks of gliner2's
``InputExample.validate`` (``record_checks``: mentions and values must occur in the text, case-insensitively, or be
exact ``{"text", "start", "end"}`` spans), adds type checks, and refuses unknown keys instead of ignoring them.
All problems are collected and reported in one ``RecordError``; no record is ever dropped.

Annotation files in other formats (CoNLL/BIO, spaCy DocBin and JSONL, Label Studio, doccano; ``session_core.formats``)
load the same way with ``format=`` (a format name, or ``"auto"`` to detect each file's): ``load_records("train.conll",
format="conll")`` gives exactly the records ``prefect-gliner2 convert`` writes for that file, so converting first or
not plans the same run. ``read_data`` also says what each file was read as.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from prefect_gliner2.session_core.canonical import RecordSet, encode_record, paused_gc
from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.formats.convert import read_documents, records_of, resolve_format
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.registry import AUTO, NATIVE
from prefect_gliner2.session_core.record_checks import TEXT_FORMAT_KEYS, check_record, key_problems, suggest

__all__ = ["MAX_LISTED_PROBLEMS", "DataReading", "load_records", "planner_source", "read_data"]

MAX_LISTED_PROBLEMS = 20


class _Builder:
    """Accumulates canonical records and problems while loading (keeps only the first listed problems)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.canonical: list[str] = []
        self.digests = bytearray()
        self.lengths = array("I")
        self.rows = 0
        self.bad_rows = 0
        self.blank_lines = 0
        self.problem_count = 0
        self.listed: list[str] = []

    def problem(self, message: str) -> None:
        self.problem_count += 1
        if len(self.listed) < MAX_LISTED_PROBLEMS:
            self.listed.append(message)

    def add(self, item: Any, where: str = "", parsed_json: bool = False) -> None:
        row = self.rows
        self.rows += 1
        if type(item) is dict and len(item) == 2 and "input" in item and "output" in item:
            record: dict[str, Any] | None = item  # the common native form: no conversion needed
            reasons: list[str] = []
        else:
            record, reasons = _native_dict(item)
        if record is not None and not reasons:
            reasons = check_record(record["input"], record["output"])
            if not reasons and not parsed_json:
                reasons = key_problems(record["output"])
        text, data = "", b""
        if record is not None and not reasons:
            text, data, reason = encode_record(record)
            if reason:
                reasons = [reason]
        if reasons or record is None:
            self.bad_rows += 1
            for reason in reasons:
                self.problem(f"row {row}{where}: {reason}")
            return
        if self.bad_rows == 0:
            self.canonical.append(text)
            self.digests += hashlib.sha256(data).digest()
            self.lengths.append(len(record["input"]))

    def finish(self, source: str, allow_empty: bool) -> RecordSet:
        if self.problem_count:
            listing = "\n  ".join(self.listed)
            more = self.problem_count - len(self.listed)
            tail = f"\n  ... and {more} more problem(s)" if more else ""
            blanks = f" and {self.blank_lines} blank line(s) were found" if self.blank_lines else ""
            raise RecordError(
                f"{self.bad_rows} of {self.rows} {self.what} records are invalid{blanks} ({source}); "
                "nothing was dropped "
                f"or used: fix or remove them and load again:\n  {listing}{tail}"
            )
        if not self.canonical and not allow_empty:
            raise RecordError(f"no {self.what} records: {source} is empty; pass at least one record")
        return RecordSet(self.canonical, bytes(self.digests), self.lengths)


def load_records(
    source: Any,
    *,
    what: str = "training",
    allow_empty: bool = False,
    format: str | None = None,
    options: FormatOptions | None = None,
) -> RecordSet:
    """Load, validate and canonicalize records from any accepted input (see the module docstring).

    ``what`` names the records in messages ("training", "validation"). Raises ``RecordError`` listing every
    problem as ``row <i>: <reason>`` (JSONL rows also name file and line); an empty input is an error unless
    ``allow_empty``. ``format`` (None: gliner2's records) reads files of another annotation format, ``"auto"``
    detects each file's; ``options`` are that format's settings (``FormatOptions``).
    """
    if format is not None and format != NATIVE:
        return read_data(source, format=format, options=options, what=what, allow_empty=allow_empty).records
    if options is not None and options.changed():
        raise RecordError(f"format options {options.changed()} do not apply to gliner2 records; pass format=")
    if isinstance(source, RecordSet):
        if not source and not allow_empty:
            raise RecordError(f"no {what} records: the record set is empty; pass at least one record")
        return source
    builder = _Builder(what)
    with paused_gc():
        paths = _as_paths(source)
        if paths is not None:
            for path in paths:
                _read_jsonl(path, builder)
            return builder.finish(", ".join(paths) if len(paths) <= 3 else f"{len(paths)} JSONL files", allow_empty)
        for item in _as_items(source):
            builder.add(item)
        return builder.finish(f"{builder.rows} in-memory records", allow_empty)


@dataclass(frozen=True)
class DataReading:
    """Records loaded from files, and one line per file saying what it was read as."""

    records: RecordSet
    files: list[str]


def read_data(
    source: Any,
    *,
    format: str = AUTO,
    options: FormatOptions | None = None,
    what: str = "training",
    allow_empty: bool = False,
) -> DataReading:
    """``load_records`` for files of any format (``auto``: each file's detected), saying what each file was read as.
    Converted records list every label of all the converted files of this call (see ``session_core.formats``)."""
    paths = _as_paths(source)
    if paths is None:
        if format not in (AUTO, NATIVE):
            raise RecordError(f"format {format!r} applies to files; pass file paths, or records without format=")
        return DataReading(load_records(source, what=what, allow_empty=allow_empty), [])
    options = options or FormatOptions()
    formats = [resolve_format(path, format, options) for path in paths]
    readings = [
        None if fmt == NATIVE else read_documents(path, fmt, options)
        for path, (fmt, _) in zip(paths, formats, strict=True)
    ]
    foreign = [reading for reading in readings if reading is not None]
    converted = iter(records_of(foreign) if foreign else [])
    builder = _Builder(what)
    files = []
    with paused_gc():
        for path, (_, why), reading in zip(paths, formats, readings, strict=True):
            if reading is None:
                _read_jsonl(path, builder)
                files.append(f"{path}: gliner2 records" + (f" (detected from {why})" if why else ""))
                continue
            for document in reading.documents:
                builder.add(next(converted), f" ({document.where})", parsed_json=True)
            files.append(reading.describe() + (f" (format detected from {why})" if why else ""))
        source_name = ", ".join(paths) if len(paths) <= 3 else f"{len(paths)} files"
        return DataReading(builder.finish(source_name, allow_empty), files)


def planner_source(
    paths: str | list[str] | None, *, format: str = AUTO, options: FormatOptions | None = None, what: str = "training"
) -> tuple[Any, list[str]]:
    """Data files as a planner takes them, and what each converted file was read as: the paths unchanged when every
    file holds gliner2 records (read later, as always), else the records of every file (``read_data``)."""
    if not paths:
        return paths, []
    listed = [paths] if isinstance(paths, str) else list(paths)
    options = options or FormatOptions()
    if all(resolve_format(path, format, options)[0] == NATIVE for path in listed):
        return paths, []
    reading = read_data(listed, format=format, options=options, what=what)
    return reading.records, reading.files


def _as_paths(source: Any) -> list[str] | None:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source):
        return [os.fspath(s) for s in source]
    if isinstance(source, (list, tuple)) and any(isinstance(s, (str, os.PathLike)) for s in source):
        raise RecordError("records mix file paths and in-memory records; pass either JSONL paths or records, not both")
    return None


def _as_items(source: Any) -> Iterable[Any]:
    if isinstance(source, (bytes, bytearray, Mapping)):
        kind = "a single record" if isinstance(source, Mapping) else "bytes"
        raise RecordError(f"records must be a list of records or JSONL path(s), got {kind}; wrap records in a list")
    to_records = getattr(source, "to_records", None)  # gliner2 TrainingDataset
    if callable(to_records):
        return to_records()
    if isinstance(source, Iterable):
        return source
    raise RecordError(
        f"cannot read records from {type(source).__name__}; pass a JSONL path/URL, a list of them, "
        "a list of {'input', 'output'} dicts, or InputExample objects"
    )


def _read_jsonl(uri: str, builder: _Builder) -> None:
    with fsspec.open(uri, "rb", compression="infer") as handle:
        for line_no, raw in enumerate(handle, 1):
            where = f" ({uri} line {line_no})"
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                builder.problem(
                    f"{uri} line {line_no}: not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                    "re-encode the file as UTF-8"
                )
                builder.bad_rows += 1
                builder.rows += 1
                continue
            if not line.strip():
                builder.blank_lines += 1
                builder.problem(
                    f"{uri} line {line_no}: blank line; every line must hold one JSON record (remove blank lines)"
                )
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                builder.problem(f"row {builder.rows}{where}: invalid JSON: {exc}")
                builder.bad_rows += 1
                builder.rows += 1
                continue
            builder.add(item, where, parsed_json=True)


def _native_dict(item: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """Convert one accepted input to ``{"input", "output"}`` (not yet validated), or explain why not."""
    if not isinstance(item, Mapping):
        to_dict = getattr(item, "to_dict", None)
        if callable(to_dict):
            item = to_dict()
            if not isinstance(item, Mapping):
                return None, [f"to_dict() returned {type(item).__name__}, not a {{'input', 'output'}} dict"]
        elif isinstance(getattr(item, "text", None), str):
            item = _from_attributes(item)
        else:
            return None, [
                f"unsupported record type {type(item).__name__}; pass {{'input': text, 'output': {{...}}}} dicts, "
                "JSONL paths or InputExample objects"
            ]
    keys = set(item)
    if "input" in keys or "output" in keys:
        return _pick(item, ("input", "output"), ("input", "output"), "a record is {'input': text, 'output': {...}}")
    if "text" in keys and "schema" in keys:
        return _pick(
            item, ("text", "schema"), ("input", "output"), "a {'text', 'schema'} record has only those two keys"
        )
    if "text" in keys:
        extra = sorted(str(k) for k in keys - {"text", *TEXT_FORMAT_KEYS})
        if extra:
            return None, [
                f"unknown top-level key(s) {extra} in a {{'text': ...}} record "
                f"(only {list(TEXT_FORMAT_KEYS)} are read); "
                "use the native form {'input': text, 'output': {...}} to pass them"
            ]
        return {"input": item["text"], "output": {k: item[k] for k in TEXT_FORMAT_KEYS if k in item}}, []
    return None, [
        f"unknown record format with keys {sorted(str(k) for k in keys)}; expected {{'input', 'output'}}, "
        "{'text', 'schema'} or {'text', 'entities', ...}"
    ]


def _pick(
    item: Mapping[str, Any], names: tuple[str, str], canon: tuple[str, str], hint: str
) -> tuple[dict | None, list[str]]:
    reasons = [f"missing key {name!r}" for name in names if name not in item]
    extra = sorted(str(k) for k in item if k not in names)
    if extra:
        hints = [f"{k!r}" + suggest(k, names) for k in extra]
        reasons.append(f"unknown top-level key(s) {', '.join(hints)}; {hint}")
    if reasons:
        return None, reasons
    return {canon[0]: item[names[0]], canon[1]: item[names[1]]}, []


def _from_attributes(obj: Any) -> dict[str, Any]:
    """An InputExample-like object without ``to_dict``: read its attributes the way ``to_dict`` would."""

    def as_dicts(values: Any) -> Any:
        return [v.to_dict() if callable(getattr(v, "to_dict", None)) else v for v in values or ()]

    output: dict[str, Any] = {}
    for attr, key in (("entities", "entities"), ("entity_descriptions", "entity_descriptions")):
        if getattr(obj, attr, None):
            output[key] = getattr(obj, attr)
    for attr, key in (
        ("classifications", "classifications"),
        ("structures", "json_structures"),
        ("relations", "relations"),
    ):
        if getattr(obj, attr, None):
            output[key] = as_dicts(getattr(obj, attr))
    return {"input": obj.text, "output": output}
