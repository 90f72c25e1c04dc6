"""Seeded paired bootstrap over whole records: micro and per-label F1 of several models and their differences.

    result = bootstrap_f1([current, candidate], pairs=[(1, 0)], confidence=0.95, resamples=2000, seed=0)
    result.micro_difference[0].low      # lower bound of (candidate F1 - current F1)

Every model was scored on the same records (:class:`~prefect_gliner2.session_core.record_counts.RecordCounts` in the
same label order). A resample draws records with replacement, the same records for every model (the paired bootstrap
of Berg-Kirkpatrick et al. 2012 and Dror et al. 2018), and recomputes each F1 as a ratio of the resampled records'
summed counts, ``2 tp / (2 tp + fp + fn)``: a record is the unit, so the mentions of one record move together.

The resampling and the interval are ``scipy.stats.bootstrap`` with a seeded ``numpy.random.Generator``. Its data are
the record indices: scipy's own ``paired=True`` resamples the indices of the observations too, then gathers every
input array along them, which for F1 copies ``labels x 4`` count arrays per resample (and again for each leave-one-out
sample of BCa's jackknife). Here the statistic turns a batch of resampled indices into per-record weights
(``bincount``) and sums the counts with one matrix product: the same resampling scheme, about 3x faster
(``bench/promotion.py``, 5,000 records x 10 labels x 2,000 resamples on 2 loaded cores: 1.8-3.4 s for scipy's gather,
0.6 s here). The default interval is the percentile one: BCa's jackknife costs records x records work (a decision on
5,000 test and 5,000 guard records: about 4 s with BCa, 1.2 s with percentiles) and is undefined where every resample
agrees (a label both models get right everywhere); there the percentile bounds are used. numpy and scipy load inside
:func:`bootstrap_f1` only.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import RecordError
from prefect_gliner2.session_core.record_counts import RecordCounts

__all__ = ["METHODS", "F1Intervals", "Interval", "bootstrap_f1"]

logger = logging.getLogger(__name__)

METHODS: tuple[str, ...] = ("percentile", "basic", "BCa")  # scipy.stats.bootstrap's interval methods
_WEIGHT_CELLS = 2_000_000  # resample weights held at once (resamples x records), about 16 MB


@dataclass(frozen=True)
class Interval:
    """A point estimate on all records and the bounds of its bootstrap confidence interval."""

    estimate: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        return cls(float(data["estimate"]), float(data["low"]), float(data["high"]))


@dataclass(frozen=True)
class F1Intervals:
    """Intervals by model (in the order given), by label (in the tables' label order) and by compared pair."""

    labels: tuple[tuple[str, str], ...]
    micro: tuple[Interval, ...]  # per model
    per_label: tuple[tuple[Interval, ...], ...]  # per model, then per label
    micro_difference: tuple[Interval, ...]  # per pair (a, b): F1 of model a - F1 of model b
    label_difference: tuple[tuple[Interval, ...], ...]  # per pair, then per label


def bootstrap_f1(
    tables: Sequence[RecordCounts],
    *,
    pairs: Sequence[tuple[int, int]] = (),
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    method: str = "percentile",
) -> F1Intervals:
    """Two-sided intervals at ``confidence`` for each model's micro and per-label F1 and, for each pair ``(a, b)``
    of model positions, for F1(a) - F1(b); the same ``seed`` gives the same intervals."""
    import numpy as np
    from scipy import stats

    counts = _count_matrix(tables, pairs)
    n, models, labels = counts.shape[0], len(tables), len(tables[0].labels)
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")

    def statistic(indices: Any, axis: int = -1) -> Any:
        index = np.asarray(indices)
        lead, m = index.shape[:-1], index.shape[-1]
        flat = index.reshape(-1, m)
        k = flat.shape[0]
        offsets = (np.arange(k) * n)[:, None]
        weights = np.bincount((flat + offsets).ravel(), minlength=k * n).reshape(k, n).astype(np.float64)
        sums = (weights @ counts.reshape(n, -1)).reshape(k, models, labels, 2)  # (tp, fp + fn) per label
        values = _f1_values(np, sums, pairs)  # (k, statistics)
        return np.moveaxis(values, 0, -1).reshape(values.shape[1], *lead)

    estimate = statistic(np.arange(n))
    batch = max(1, min(resamples, _WEIGHT_CELLS // n))
    with warnings.catch_warnings():  # BCa on a constant distribution: NaN bounds, replaced below
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            (np.arange(n),),
            statistic,
            vectorized=True,
            n_resamples=resamples,
            batch=batch,
            confidence_level=confidence,
            method=method,
            rng=np.random.default_rng(seed),
        )
    low, high = np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)
    undefined = np.isnan(low) | np.isnan(high)
    if undefined.any():  # BCa is undefined where every resample agrees (or its acceleration is): use percentiles
        alpha = (1 - confidence) / 2
        quantiles = np.quantile(result.bootstrap_distribution, [alpha, 1 - alpha], axis=-1)
        low, high = np.where(undefined, quantiles[0], low), np.where(undefined, quantiles[1], high)
        logger.debug("%d of %d BCa intervals undefined; percentile intervals used there", undefined.sum(), low.size)
    intervals = [Interval(float(e), float(lo), float(hi)) for e, lo, hi in zip(estimate, low, high, strict=True)]
    return _unpack(intervals, tables[0].labels, models, labels, len(pairs))


def _count_matrix(tables: Sequence[RecordCounts], pairs: Sequence[tuple[int, int]]) -> Any:
    """(records, models, labels, 2) float64: tp and fp + fn of each label, checked to line up across models."""
    import numpy as np

    if not tables:
        raise RecordError("bootstrap_f1 needs the record counts of at least one model")
    first = tables[0]
    for i, table in enumerate(tables[1:], start=1):
        if table.labels != first.labels or table.records != first.records:
            raise RecordError(
                f"model {i}: {table.records} records over labels {list(table.labels)}, model 0: {first.records} "
                f"over {list(first.labels)}; align them with RecordCounts.check_same_records first"
            )
    if first.records < 2:
        raise RecordError(f"a bootstrap needs at least 2 records, got {first.records}; score more records")
    if not first.labels:
        raise RecordError("the record counts have no labels: there is no F1 to compare")
    for a, b in pairs:
        if not (0 <= a < len(tables) and 0 <= b < len(tables)) or a == b:
            raise ValueError(f"pair {(a, b)} must name two different models among positions 0..{len(tables) - 1}")
    raw = np.array([table.rows for table in tables], dtype=np.int64)  # (models, records, 3 * labels)
    raw = raw.reshape(len(tables), first.records, len(first.labels), 3).transpose(1, 0, 2, 3)
    return np.stack([raw[..., 0], raw[..., 1] + raw[..., 2]], axis=-1).astype(np.float64)


def _f1_values(np: Any, sums: Any, pairs: Sequence[tuple[int, int]]) -> Any:
    """(k, statistics): micro F1 per model, F1 per model and label, then the pairs' micro and label differences."""

    def f1(tp: Any, errors: Any) -> Any:
        denominator = 2 * tp + errors
        return np.divide(2 * tp, denominator, out=np.zeros_like(denominator), where=denominator > 0)

    per_label = f1(sums[..., 0], sums[..., 1])  # (k, models, labels)
    totals = sums.sum(axis=2)
    micro = f1(totals[..., 0], totals[..., 1])  # (k, models)
    k = sums.shape[0]
    parts = [micro, per_label.reshape(k, -1)]
    parts += [(micro[:, a] - micro[:, b])[:, None] for a, b in pairs]
    parts += [per_label[:, a] - per_label[:, b] for a, b in pairs]
    return np.concatenate(parts, axis=1)


def _unpack(
    flat: list[Interval], labels: tuple[tuple[str, str], ...], models: int, count: int, pairs: int
) -> F1Intervals:
    micro, rest = flat[:models], flat[models:]
    per_label = tuple(tuple(rest[m * count : (m + 1) * count]) for m in range(models))
    rest = rest[models * count :]
    micro_difference, rest = tuple(rest[:pairs]), rest[pairs:]
    label_difference = tuple(tuple(rest[p * count : (p + 1) * count]) for p in range(pairs))
    return F1Intervals(labels, tuple(micro), per_label, micro_difference, label_difference)
