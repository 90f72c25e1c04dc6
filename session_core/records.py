"""Training records: load, validate and canonicalize GLiNER2 examples without importing gliner2.

Accepted inputs (``load_records``): a JSONL path or fsspec URL (or a list of them; compression is inferred
from the extension), a list of native dicts ``{"input": text, "output": {...}}``, the native loader's
alternatives ``{"text": ..., "schema": {...}}`` and ``{"text": ..., "entities"/"classifications"/"relations"/
"json_structures": ...}``, and InputExample-like objects (anything with ``to_dict()``; gliner2 itself is never
imported because it imports torch).

Every record becomes the dict ``{"input": text, "output": {...}}``, stored as its record JSON (``record_json``:
``json.dumps(separators=(",", ":"), ensure_ascii=False, allow_nan=False)`` of ``input`` then ``output``) with the
sha256 of that JSON's UTF-8 bytes as its content hash. Key order inside ``output`` is KEPT as given, never sorted:
gliner2's preprocessing reads it (entity types, structure fields and relation fields become the schema in dict
order), so two records that differ only in key order train differently and must hash differently.
Validation mirrors the structural checks of gliner2's ``InputExample.validate`` (mentions and values must occur in the
text, case-insensitively, or be exact ``{"text", "start", "end"}`` spans), adds type checks, and refuses unknown keys
instead of ignoring them.
All problems are collected and reported in one ``RecordError``; no record is ever dropped.
"""

from __future__ import annotations

import gc
import hashlib
import json
import json.encoder
import os
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, overload

import fsspec

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.record_checks import TEXT_FORMAT_KEYS, check_record, key_problems, suggest

__all__ = ["Record", "RecordSet", "canonical_json", "load_records", "paused_gc", "record_json"]

MAX_LISTED_PROBLEMS = 20
_CANONICAL_KW: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}


_RECORD_KW: dict[str, Any] = {**_CANONICAL_KW, "sort_keys": False}


def canonical_json(obj: Any) -> str:
    """The canonical JSON (sorted keys) of our own payloads: fingerprints, configs, manifest metadata."""
    return json.dumps(obj, **_CANONICAL_KW)


def record_json(obj: Any) -> str:
    """The JSON of records and record lists: compact like ``canonical_json`` but keeping key order (it is data)."""
    return json.dumps(obj, **_RECORD_KW)


def _not_json(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable")


def _make_fast_encoder() -> Callable[[Any], str]:
    """``record_json`` without per-call encoder construction (C encoder reused); verified on a sample."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return record_json
    try:
        encoder = make(None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False)

        def encode(obj: Any) -> str:
            return "".join(encoder(obj, 0))

        sample = {"b": [1, 2.5, -0.0, 1e300, None, True, 'é\u2028"\\'], "a": {"z": (1,), "y": ""}}
        if encode(sample) != record_json(sample):
            return record_json
        return encode
    except Exception:  # any surprise in a private API: use the public one
        return record_json


_encode = _make_fast_encoder()


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many acyclic objects (restores the prior state)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class Record:
    """One training record: its record JSON (key order kept), sha256 content hash and input text length."""

    canonical_json: str
    content_hash: str
    text_length: int

    @property
    def example(self) -> dict[str, Any]:
        """A fresh dict ``{"input": ..., "output": {...}}`` in the given key order (mutating it changes nothing
        here)."""
        return json.loads(self.canonical_json)

    def to_dict(self) -> dict[str, Any]:
        return self.example


class RecordSet(Sequence[Record]):
    """An immutable, ordered set of validated records, stored column-wise (strings, digests, lengths)."""

    __slots__ = ("_canonical", "_digests", "_lengths", "_digest_hex")

    def __init__(self, canonical: list[str], digests: bytes, lengths: array) -> None:
        if len(digests) != 32 * len(canonical) or len(lengths) != len(canonical):
            raise ValueError("RecordSet columns disagree in length; build record sets with load_records()")
        self._canonical = canonical
        self._digests = bytes(digests)
        self._lengths = lengths
        self._digest_hex: str | None = None

    def __len__(self) -> int:
        return len(self._canonical)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> RecordSet: ...
    def __getitem__(self, index: int | slice) -> Record | RecordSet:
        if isinstance(index, slice):
            rows = range(len(self))[index]
            return RecordSet(
                [self._canonical[r] for r in rows],
                b"".join(self.digest(r) for r in rows),
                array("I", (self._lengths[r] for r in rows)),
            )
        i = self._row(index)
        return Record(self._canonical[i], self._digests[32 * i : 32 * i + 32].hex(), self._lengths[i])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordSet):
            return NotImplemented
        return self._digests == other._digests

    def __hash__(self) -> int:
        return hash(self._digests)

    def __repr__(self) -> str:
        return f"RecordSet({len(self)} records, sha256 {self.digest_hex[:12]})"

    def _row(self, index: int) -> int:
        n = len(self._canonical)
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"record index must be an int, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"record row {index} is out of range: this set has {n} records (rows 0..{n - 1})")
        return index % n

    def canonical(self, row: int) -> str:
        """Row ``row``'s canonical JSON."""
        return self._canonical[self._row(row)]

    def example(self, row: int) -> dict[str, Any]:
        """Row ``row`` as a fresh canonical dict."""
        return json.loads(self._canonical[self._row(row)])

    def examples(self, rows: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """Fresh canonical dicts for ``rows`` (all rows when None), in the given order."""
        if rows is None:
            with paused_gc():
                return json.loads(self.json_array()) if self._canonical else []
        return [json.loads(self._canonical[self._row(r)]) for r in rows]

    def json_array(self) -> str:
        """The JSON array of all records (identical to ``record_json(self.examples())``)."""
        return "[" + ",".join(self._canonical) + "]"

    def digest(self, row: int) -> bytes:
        """Row ``row``'s 32-byte sha256 content digest."""
        i = self._row(row)
        return self._digests[32 * i : 32 * i + 32]

    def content_hash(self, row: int) -> str:
        return self.digest(row).hex()

    @property
    def lengths(self) -> array:
        """Input text lengths in characters (a copy), used for length grouping."""
        return array("I", self._lengths)

    @property
    def digest_hex(self) -> str:
        """sha256 over every record's 32-byte content digest, in row order."""
        if self._digest_hex is None:
            self._digest_hex = hashlib.sha256(self._digests).hexdigest()
        return self._digest_hex


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
            text, data, reason = _canonical(record)
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


def load_records(source: Any, *, what: str = "training", allow_empty: bool = False) -> RecordSet:
    """Load, validate and canonicalize records from any accepted input (see the module docstring).

    ``what`` names the records in messages ("training", "validation"). Raises ``RecordError`` listing every
    problem as ``row <i>: <reason>`` (JSONL rows also name file and line); an empty input is an error unless
    ``allow_empty``.
    """
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


def _canonical(record: dict[str, Any]) -> tuple[str, bytes, str | None]:
    """Canonical JSON text and its UTF-8 bytes, or why the record cannot be encoded."""
    try:
        text = _encode({"input": record["input"], "output": record["output"]})
        return text, text.encode("utf-8"), None
    except UnicodeEncodeError:
        return "", b"", "contains text that is not valid Unicode (a lone surrogate); fix the encoding"
    except (TypeError, ValueError) as exc:
        return "", b"", f"not JSON-serializable: {exc}; use only strings, numbers, booleans, null, lists and objects"
    except RecursionError:
        return "", b"", "contains a circular or too deeply nested structure"
