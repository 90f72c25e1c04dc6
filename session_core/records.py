"""Training records: load, validate and canonicalize GLiNER2 examples without importing gliner2.

Accepted inputs (``load_records``): a JSONL path or fsspec URL (or a list of them; compression is inferred
from the extension), a list of native dicts ``{"input": text, "output": {...}}``, the native loader's
alternatives ``{"text": ..., "schema": {...}}`` and ``{"text": ..., "entities"/"classifications"/"relations"/
"json_structures": ...}``, and InputExample-like objects (anything with ``to_dict()``; gliner2 itself is never
imported because it imports torch).

Every record becomes the canonical dict ``{"input": text, "output": {...}}``, stored as its canonical JSON
(``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``) with the sha256 of
that JSON's UTF-8 bytes as its content hash. Validation mirrors the structural checks of gliner2's
``InputExample.validate`` (mentions and values must occur in the text, case-insensitively, or be exact
``{"text", "start", "end"}`` spans), adds type checks, and refuses unknown keys instead of ignoring them.
All problems are collected and reported in one ``RecordError``; no record is ever dropped.
"""

from __future__ import annotations

import difflib
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

from session_core.errors import RecordError

__all__ = ["Record", "RecordSet", "canonical_json", "load_records", "paused_gc"]

MAX_LISTED_PROBLEMS = 20
OUTPUT_KEYS: tuple[str, ...] = (
    "entities", "entity_descriptions", "classifications", "json_structures", "json_descriptions",
    "record_metadata", "relations", "relation_descriptions",
)
# The annotation keys the native loader lifts from a top-level {"text": ...} record.
TEXT_FORMAT_KEYS: tuple[str, ...] = ("entities", "classifications", "relations", "json_structures")
_OUTPUT_KEY_SET = frozenset(OUTPUT_KEYS)
_CANONICAL_KW: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}


def canonical_json(obj: Any) -> str:
    """The one canonical JSON encoding used for record hashes, fingerprints and content addresses."""
    return json.dumps(obj, **_CANONICAL_KW)


def _not_json(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable")


def _make_fast_encoder() -> Callable[[Any], str]:
    """``canonical_json`` without per-call encoder construction (C encoder reused); verified on a sample."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return canonical_json
    try:
        encoder = make(None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False)

        def encode(obj: Any) -> str:
            return "".join(encoder(obj, 0))

        sample = {"b": [1, 2.5, -0.0, 1e300, None, True, "é\u2028\"\\"], "a": {"z": (1,), "y": ""}}
        if encode(sample) != canonical_json(sample):
            return canonical_json
        return encode
    except Exception:  # any surprise in a private API: use the public one
        return canonical_json


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
    """One canonical training record: its canonical JSON, sha256 content hash and input text length."""

    canonical_json: str
    content_hash: str
    text_length: int

    @property
    def example(self) -> dict[str, Any]:
        """A fresh canonical dict ``{"input": ..., "output": {...}}`` (mutating it changes nothing here)."""
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
            return RecordSet([self._canonical[r] for r in rows], b"".join(self.digest(r) for r in rows),
                             array("I", (self._lengths[r] for r in rows)))
        i = self._row(index)
        return Record(self._canonical[i], self._digests[32 * i:32 * i + 32].hex(), self._lengths[i])

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
        """The canonical JSON array of all records (identical to ``canonical_json(self.examples())``)."""
        return "[" + ",".join(self._canonical) + "]"

    def digest(self, row: int) -> bytes:
        """Row ``row``'s 32-byte sha256 content digest."""
        i = self._row(row)
        return self._digests[32 * i:32 * i + 32]

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
                reasons = _key_problems(record["output"])
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
                f"{self.bad_rows} of {self.rows} {self.what} records are invalid{blanks} ({source}); nothing was dropped "
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
                builder.problem(f"{uri} line {line_no}: not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8")
                builder.bad_rows += 1
                builder.rows += 1
                continue
            if not line.strip():
                builder.blank_lines += 1
                builder.problem(f"{uri} line {line_no}: blank line; every line must hold one JSON record (remove blank lines)")
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
        return _pick(item, ("text", "schema"), ("input", "output"), "a {'text', 'schema'} record has only those two keys")
    if "text" in keys:
        extra = sorted(str(k) for k in keys - {"text", *TEXT_FORMAT_KEYS})
        if extra:
            return None, [
                f"unknown top-level key(s) {extra} in a {{'text': ...}} record (only {list(TEXT_FORMAT_KEYS)} are read); "
                "use the native form {'input': text, 'output': {...}} to pass them"
            ]
        return {"input": item["text"], "output": {k: item[k] for k in TEXT_FORMAT_KEYS if k in item}}, []
    return None, [
        f"unknown record format with keys {sorted(str(k) for k in keys)}; expected {{'input', 'output'}}, "
        "{'text', 'schema'} or {'text', 'entities', ...}"
    ]


def _pick(item: Mapping[str, Any], names: tuple[str, str], canon: tuple[str, str], hint: str) -> tuple[dict | None, list[str]]:
    reasons = [f"missing key {name!r}" for name in names if name not in item]
    extra = sorted(str(k) for k in item if k not in names)
    if extra:
        hints = [f"{k!r}" + _suggest(k, names) for k in extra]
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
    for attr, key in (("classifications", "classifications"), ("structures", "json_structures"), ("relations", "relations")):
        if getattr(obj, attr, None):
            output[key] = as_dicts(getattr(obj, attr))
    return {"input": obj.text, "output": output}


def _canonical(record: dict[str, Any]) -> tuple[str, bytes, str | None]:
    """Canonical JSON text and its UTF-8 bytes, or why the record cannot be encoded."""
    try:
        text = _encode(record)
        return text, text.encode("utf-8"), None
    except UnicodeEncodeError:
        return "", b"", "contains text that is not valid Unicode (a lone surrogate); fix the encoding"
    except (TypeError, ValueError) as exc:
        return "", b"", f"not JSON-serializable: {exc}; use only strings, numbers, booleans, null, lists and objects"
    except RecursionError:
        return "", b"", "contains a circular or too deeply nested structure"


_CONTAINERS = (dict, list, tuple)
# Output values whose inner structure check_record does not inspect key by key.
_OPAQUE_KEYS = ("classifications", "json_descriptions", "record_metadata", "relation_descriptions")


def _key_problems(output: Mapping[str, Any]) -> list[str]:
    """Dict keys JSON would silently turn into strings (only possible for in-memory records)."""
    stack = [output[k] for k in _OPAQUE_KEYS if k in output]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, inner in value.items():
                if not isinstance(key, str):
                    return [f"'output' has a non-string key {key!r}; JSON object keys must be strings"]
                if isinstance(inner, _CONTAINERS):
                    stack.append(inner)
        elif isinstance(value, (list, tuple)):
            stack.extend(inner for inner in value if isinstance(inner, _CONTAINERS))
    return []


def _suggest(name: Any, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------------------- validation
# Mirrors gliner2 InputExample.validate (and the Classification/Structure/Relation validators) without gliner2.

_NO_TASK = (
    "no task: 'output' needs at least one of entities, classifications, json_structures or relations; a negative "
    "example declares the labels it is negative for, e.g. {'entities': {'person': [], 'company': []}}"
)


def _is_map(value: Any) -> bool:
    return isinstance(value, dict) or isinstance(value, Mapping)


def check_record(text: Any, output: Any) -> list[str]:
    """Every structural problem of one native record (empty list: valid)."""
    if not isinstance(text, str):
        return [f"'input' must be a string, got {type(text).__name__}"]
    if not text.strip():
        return ["'input' text is empty"]
    if not _is_map(output):
        return [f"'output' must be an object of tasks, got {type(output).__name__}"]
    problems = [
        f"unknown output key {k!r}{_suggest(k, OUTPUT_KEYS)}; known keys are {list(OUTPUT_KEYS)}"
        for k in output if k not in _OUTPUT_KEY_SET
    ]
    lowered = text.lower()
    if "entities" in output or "entity_descriptions" in output:
        _check_entities(output, text, lowered, problems)
    if "classifications" in output:
        _check_classifications(output["classifications"], problems)
    if "json_structures" in output:
        _check_named_groups(output["json_structures"], "json_structures", "structure", text, lowered, problems)
    if "relations" in output:
        _check_named_groups(output["relations"], "relations", "relation", text, lowered, problems)
    for key in ("json_descriptions", "record_metadata", "relation_descriptions"):
        if key in output and not _is_map(output[key]):
            problems.append(f"'{key}' must be an object, got {type(output[key]).__name__}")
    if not problems and not (
        output.get("entities") or output.get("classifications") or output.get("json_structures") or output.get("relations")
    ):
        problems.append(_NO_TASK)
    return problems


def _locate(value: Any, text: str, lowered: str) -> str | None:
    """None when ``value`` is locatable in ``text`` (as gliner2's ``_is_locatable``), else why not."""
    if isinstance(value, str):
        return None if not value or value.lower() in lowered else "not found in text (case-insensitive)"
    if value is None:
        return None
    if isinstance(value, list):
        for inner in value:
            reason = _locate(inner, text, lowered)
            if reason:
                return f"item {inner!r} {reason}"
        return None
    if _is_map(value):
        return _locate_span(value, text)
    return f"must be a string or a {{'text', 'start', 'end'}} span, got {type(value).__name__}"


def _locate_span(span: Mapping[str, Any], text: str) -> str | None:
    missing = sorted({"text", "start", "end"} - set(span))
    if missing:
        return f"is a span missing {missing}"
    start, end = span["start"], span["end"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return "is a span whose start/end are not integers"
    if not 0 <= start < end:
        return f"is a span with invalid offsets [{start}, {end})"
    if text[start:end] != span["text"]:
        return f"is a span whose offsets [{start}, {end}) hold {text[start:end]!r}, not {span['text']!r}"
    return None


def _check_entities(output: Mapping[str, Any], text: str, lowered: str, problems: list[str]) -> None:
    entities = output.get("entities")
    if entities is not None and not _is_map(entities):
        problems.append(f"'entities' must be an object of type -> list of mentions, got {type(entities).__name__}")
        entities = None
    for etype, mentions in (entities or {}).items():
        if not isinstance(etype, str) or not etype:
            problems.append(f"entity type {etype!r} must be a non-empty string")
        if not isinstance(mentions, list):
            problems.append(f"entities[{etype!r}] must be a list of mentions, got {type(mentions).__name__}; wrap it in a list")
            continue
        for mention in mentions:
            if isinstance(mention, str):  # the common case, inlined
                if mention and mention.lower() not in lowered:
                    problems.append(f"entity {mention!r} (type: {etype}) not found in text (case-insensitive)")
                continue
            reason = _locate(mention, text, lowered)
            if reason:
                problems.append(f"entity {mention!r} (type: {etype}) {reason}")
    descriptions = output.get("entity_descriptions")
    if descriptions is None:
        return
    if not _is_map(descriptions):
        problems.append(f"'entity_descriptions' must be an object of type -> description, got {type(descriptions).__name__}")
        return
    declared = entities if isinstance(entities, Mapping) else {}
    for etype, desc in descriptions.items():
        if not isinstance(desc, str):
            problems.append(f"entity_descriptions[{etype!r}] must be a string, got {type(desc).__name__}")
        if etype not in declared:
            problems.append(
                f"entity_descriptions describes {etype!r}, which is not in entities; add {etype!r}: [] to entities "
                "to train it as a negative, or remove the description"
            )


def _check_classifications(tasks: Any, problems: list[str]) -> None:
    if tasks is None:
        return
    if not isinstance(tasks, list):
        problems.append(f"'classifications' must be a list, got {type(tasks).__name__}")
        return
    for i, task in enumerate(tasks):
        if not _is_map(task):
            problems.append(f"classification {i} must be an object, got {type(task).__name__}")
            continue
        missing = [k for k in ("task", "labels", "true_label") if k not in task]
        if missing:
            problems.append(f"classification {i} is missing {missing}")
            continue
        name, labels, true = task["task"], task["labels"], task["true_label"]
        if not isinstance(name, str) or not name:
            problems.append(f"classification {i}: task name must be a non-empty string")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            problems.append(f"classification {name!r} must have a non-empty list of string labels")
            continue
        trues = [true] if isinstance(true, str) else true
        if not isinstance(trues, list) or not all(isinstance(x, str) for x in trues):
            problems.append(f"classification {name!r}: true_label must be a string or a list of strings")
            continue
        problems.extend(f"true label {t!r} not in labels list for task {name!r}" for t in trues if t not in labels)
        _check_classification_extras(task, name, labels, problems)


def _check_classification_extras(task: Mapping[str, Any], name: Any, labels: list[str], problems: list[str]) -> None:
    if not isinstance(task.get("multi_label", False), bool):
        problems.append(f"classification {name!r}: multi_label must be true or false")
    descriptions = task.get("label_descriptions")
    if descriptions is not None:
        if not _is_map(descriptions):
            problems.append(f"classification {name!r}: label_descriptions must be an object")
        else:
            problems.extend(
                f"label description key {k!r} not in labels for task {name!r}" for k in descriptions if k not in labels
            )
    examples = task.get("examples")
    if examples is not None:
        if not isinstance(examples, list):
            problems.append(f"classification {name!r}: examples must be a list of [input, output] pairs")
            return
        problems.extend(
            f"example {j} for task {name!r} must be an [input, output] pair"
            for j, ex in enumerate(examples) if not isinstance(ex, (list, tuple)) or len(ex) != 2
        )


def _check_named_groups(groups: Any, key: str, kind: str, text: str, lowered: str, problems: list[str]) -> None:
    """json_structures / relations: lists of ``{name: {field: value}}`` objects."""
    if groups is None:
        return
    if not isinstance(groups, list):
        problems.append(f"'{key}' must be a list of {{name: {{field: value}}}} objects, got {type(groups).__name__}")
        return
    field_sets: dict[str, tuple[str, ...]] = {}
    for i, group in enumerate(groups):
        if not _is_map(group) or not group:
            problems.append(f"{key}[{i}] must be a non-empty {{name: {{field: value}}}} object")
            continue
        for name, fields in group.items():
            if not isinstance(name, str) or not name:
                problems.append(f"{kind} name {name!r} in {key}[{i}] must be a non-empty string")
            if not _is_map(fields) or not fields:
                problems.append(f"{kind} {name!r} has no fields")
                continue
            for fname, value in fields.items():
                if not isinstance(fname, str) or not fname:
                    problems.append(f"{kind} {name!r} field name {fname!r} must be a non-empty string")
                reason = _field_problem(value, kind, text, lowered)
                if reason:
                    problems.append(f"{kind} value {value!r} for '{name}.{fname}' {reason}")
            if kind == "relation":
                names = tuple(sorted(str(f) for f in fields))
                if field_sets.setdefault(str(name), names) != names:
                    problems.append(f"relation {name!r} has inconsistent fields: {field_sets[str(name)]} vs {names}")


def _field_problem(value: Any, kind: str, text: str, lowered: str) -> str | None:
    if kind == "structure" and _is_map(value) and "value" in value and "choices" in value:
        choices = value["choices"]
        if not isinstance(choices, list) or value["value"] not in choices:
            return f"is a choice field whose value is not in its choices {choices!r}"
        return None
    return _locate(value, text, lowered)
