"""The canonical form of records: record JSON and its sha256 content hash, and the column-wise RecordSet.

Every record is the dict ``{"input": text, "output": {...}}``, stored as its record JSON (``record_json``:
``json.dumps(separators=(",", ":"), ensure_ascii=False, allow_nan=False)`` of ``input`` then ``output``) with the
sha256 of that JSON's UTF-8 bytes as its content hash. Key order inside ``output`` is KEPT as given, never sorted:
gliner2's preprocessing reads it (entity types, structure fields and relation fields become the schema in dict
order), so two records that differ only in key order train differently and must hash differently. Our own payloads
(fingerprints, configs, manifest metadata) use ``canonical_json``, with sorted keys.
"""

from __future__ import annotations

import gc
import hashlib
import json
import json.encoder
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, overload

__all__ = ["Record", "RecordSet", "canonical_json", "encode_record", "paused_gc", "record_json"]

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


def encode_record(record: dict[str, Any]) -> tuple[str, bytes, str | None]:
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
