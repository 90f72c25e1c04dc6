"""Benchmark: the promotion decision's paired bootstrap on thousands of records, and scipy's paired gather beside it.

Usage: python bench/promotion.py [--records 1000,5000] [--labels 10] [--resamples 2000]

Per size it prints the seconds of ``decide_promotion`` (candidate, current and base model on the test records plus a
guard set of the same size: two bootstraps) with the percentile and the BCa method, and the seconds of one
``scipy.stats.bootstrap(..., paired=True)`` over the two models' count arrays (the form that gathers every count array
per resample, session_core/bootstrap.py's docstring) against ``bootstrap_f1`` on the same two models. The counts are
synthetic (seeded); scipy's import is paid before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _tables(records: int, labels: int, seed: int) -> list:
    import numpy as np

    from prefect_gliner2.session_core.record_counts import RecordCounts

    rng = np.random.default_rng(seed)
    keys = tuple(("entities", f"label{i}") for i in range(labels))
    gold = rng.integers(0, 3, size=(records, labels))
    out = []
    for skill in (0.7, 0.75, 0.5):  # current, candidate, base
        tp = rng.binomial(gold, skill)
        fp = rng.integers(0, 2, size=(records, labels))
        rows = np.stack([tp, fp, gold - tp], axis=-1).reshape(records, -1)
        out.append(RecordCounts(keys, tuple(tuple(int(v) for v in row) for row in rows)))
    return out


def _scipy_paired(current, candidate, resamples: int) -> float:
    import numpy as np
    from scipy import stats

    def arrays(table) -> np.ndarray:
        raw = np.array(table.rows).reshape(table.records, len(table.labels), 3)
        return np.stack([raw[..., 0], raw[..., 1] + raw[..., 2]]).transpose(1, 0, 2)  # (labels, 2, records)

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        def f1(sums: np.ndarray) -> np.ndarray:
            total = sums.sum(axis=0)
            return 2 * total[0] / np.maximum(2 * total[0] + total[1], 1)

        return f1(b.sum(axis=axis)) - f1(a.sum(axis=axis))

    start = time.perf_counter()
    stats.bootstrap(
        (arrays(current), arrays(candidate)),
        statistic,
        paired=True,
        vectorized=True,
        axis=-1,
        n_resamples=resamples,
        batch=max(1, 2_000_000 // (current.records * len(current.labels) * 2)),
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="1000,5000")
    parser.add_argument("--labels", type=int, default=10)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    import scipy.stats  # noqa: F401  (imported once, outside the clock)

    from prefect_gliner2.session_core.bootstrap import bootstrap_f1
    from prefect_gliner2.session_core.promotion import PromotionRule, ScoredSet, decide_promotion

    print(
        f"{'records':>8} {'labels':>6} {'decide pct s':>12} {'decide BCa s':>12} {'scipy gather s':>14} {'ours s':>7}"
    )
    for records in (int(value) for value in args.records.split(",")):
        current, candidate, base = _tables(records, args.labels, 1)
        guard_current, guard_candidate, _ = _tables(records, args.labels, 2)
        seconds = []
        for method in ("percentile", "BCa"):
            rule = PromotionRule(resamples=args.resamples, method=method)
            start = time.perf_counter()
            decide_promotion(
                ScoredSet("test", candidate, current, base),
                guard=ScoredSet("guard", guard_candidate, guard_current),
                rule=rule,
            )
            seconds.append(time.perf_counter() - start)
        gather = _scipy_paired(current, candidate, args.resamples)
        start = time.perf_counter()
        bootstrap_f1([candidate, current], pairs=[(0, 1)], resamples=args.resamples)
        ours = time.perf_counter() - start
        print(f"{records:>8} {args.labels:>6} {seconds[0]:>12.2f} {seconds[1]:>12.2f} {gather:>14.2f} {ours:>7.2f}")


if __name__ == "__main__":
    main()
