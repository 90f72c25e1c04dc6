"""Each record's tp/fp/fn per (kind, label) for one model on one record set: the unit a paired bootstrap resamples.

    report = score_records(gold, predictions, per_record=True)
    counts = RecordCounts.from_report(report)
    counts.total().f1 == report.total().f1

Pure Python and JSON-ready (``to_dict`` / ``from_dict``), so a child process that scored a model can hand its counts
to the process that decides. Two models are comparable when they were scored on the same records: same record count,
same labels and, record by record, the same gold items per label (:meth:`RecordCounts.check_same_records`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.scoring import KINDS, Counts, LabelKey, ScoreReport

__all__ = ["COUNTS_FORMAT", "RecordCounts"]

COUNTS_FORMAT = 1  # the schema version of RecordCounts.to_dict
_KIND_ORDER = {kind: i for i, kind in enumerate(KINDS)}


@dataclass(frozen=True)
class RecordCounts:
    """``rows[r]`` holds record r's counts as ``(tp, fp, fn)`` for each label of ``labels`` in turn (3 per label)."""

    labels: tuple[LabelKey, ...]
    rows: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(set(self.labels)) != len(self.labels):
            raise RecordError(f"record counts name a label twice: {list(self.labels)}")
        for kind, label in self.labels:
            if kind not in _KIND_ORDER or not isinstance(label, str):
                raise RecordError(f"a label is (kind, name) with kind one of {list(KINDS)}, got {(kind, label)!r}")
        width = 3 * len(self.labels)
        for r, row in enumerate(self.rows):
            if len(row) != width or not all(type(v) is int for v in row) or (row and min(row) < 0):
                raise RecordError(
                    f"record {r}: expected {width} non-negative integer counts (tp, fp, fn for each of "
                    f"{len(self.labels)} labels), got {list(row)[:12]}"
                )

    @classmethod
    def from_records(
        cls, records: Sequence[Mapping[LabelKey, Counts]], labels: Sequence[LabelKey] | None = None
    ) -> RecordCounts:
        """From one {label: Counts} per record; labels default to every label seen, in kind then name order, and
        a label a record does not name counts zero there."""
        if labels is None:
            seen = {key for record in records for key in record}
            labels = sorted(seen, key=lambda key: (_KIND_ORDER.get(key[0], len(KINDS)), key[1]))
        keys = tuple((str(kind), str(label)) for kind, label in labels)
        rows = []
        for r, record in enumerate(records):
            unknown = set(record) - set(keys)
            if unknown:
                raise RecordError(f"record {r} has counts for labels outside {list(keys)}: {sorted(unknown)}")
            row: list[int] = []
            for key in keys:
                counts = record.get(key, Counts())
                row.extend((counts.tp, counts.fp, counts.fn))
            rows.append(tuple(row))
        return cls(keys, tuple(rows))

    @classmethod
    def from_report(cls, report: ScoreReport) -> RecordCounts:
        """From a report scored with ``score_records(..., per_record=True)``, over the report's labels."""
        if report.per_record is None:
            raise RecordError(
                "this score report has no per-record counts: score with score_records(..., per_record=True)"
            )
        labels = sorted(report.labels, key=lambda key: (_KIND_ORDER[key[0]], key[1]))
        return cls.from_records(report.per_record, labels)

    @property
    def records(self) -> int:
        return len(self.rows)

    def label_totals(self) -> dict[LabelKey, Counts]:
        """Each label's counts summed over all records (``ScoreReport.labels`` of the same scoring)."""
        sums = [sum(column) for column in zip(*self.rows, strict=True)] if self.rows else [0] * (3 * len(self.labels))
        return {key: Counts(*sums[3 * i : 3 * i + 3]) for i, key in enumerate(self.labels)}

    def total(self) -> Counts:
        """The summed counts over all labels and records (micro P/R/F1, as ``ScoreReport.total``)."""
        out = Counts()
        for counts in self.label_totals().values():
            out = out + counts
        return out

    def supports(self) -> list[list[int]]:
        """Gold items (tp + fn) per record and label: what two models scored on the same records share."""
        return [list(map(operator.add, row[0::3], row[2::3])) for row in self.rows]

    def reordered(self, labels: Sequence[LabelKey]) -> RecordCounts:
        """The same counts over ``labels`` (the same set, another order)."""
        if tuple(labels) == self.labels:
            return self
        if set(labels) != set(self.labels) or len(labels) != len(self.labels):
            raise RecordError(f"labels {list(labels)} are not a reordering of {list(self.labels)}")
        index = [3 * self.labels.index(key) for key in labels]
        rows = tuple(tuple(v for i in index for v in row[i : i + 3]) for row in self.rows)
        return RecordCounts(tuple(labels), rows)

    def check_same_records(self, other: RecordCounts, what: str) -> RecordCounts:
        """``other`` over this table's label order, after checking both were scored on the same records."""
        if other.records != self.records:
            raise RecordError(f"{what}: {other.records} records against {self.records}; score both on the same records")
        if set(other.labels) != set(self.labels):
            missing, extra = sorted(set(self.labels) - set(other.labels)), sorted(set(other.labels) - set(self.labels))
            raise RecordError(
                f"{what}: the labels differ (missing {missing}, extra {extra}); score both with the same data set"
            )
        aligned = other.reordered(self.labels)
        for r, (mine, theirs) in enumerate(zip(self.supports(), aligned.supports(), strict=True)):
            if mine != theirs:
                label = next(key for key, a, b in zip(self.labels, mine, theirs, strict=True) if a != b)
                raise RecordError(
                    f"{what}: record {r} has different gold items for {label[0]}/{label[1]} "
                    "(tp + fn differ): the two models were not scored on the same records"
                )
        return aligned

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COUNTS_FORMAT,
            "labels": [list(key) for key in self.labels],
            "rows": [list(r) for r in self.rows],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordCounts:
        if not isinstance(data, Mapping) or data.get("format") != COUNTS_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise RecordError(f"record counts must be a RecordCounts.to_dict() of format {COUNTS_FORMAT}, got {got!r}")
        labels = tuple((str(kind), str(label)) for kind, label in data["labels"])
        return cls(labels, tuple(tuple(row) for row in data["rows"]))
