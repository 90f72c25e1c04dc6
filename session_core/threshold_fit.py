"""Fitting extraction thresholds on validation data: a global value, and per label the value that maximises that
label's own F1 where it holds up on records it was not fitted on.

The model extracts every validation record once, at a low floor and with confidences, each record's labels asked in
the seeded shuffled order the product scores with (``label_order.shuffle_schema``, trial 0); the counts at every
candidate value (:data:`GRID`, 0.05 to 0.95 by 0.05) come from that one extraction (:mod:`.threshold_table`).

1. The global value is the candidate with the highest micro F1 over all labels (:mod:`.scoring`'s rules); ties go
   to the value nearest 0.5, then to the lower one. Labels without a value of their own use it.
2. Each label with gold items (at least ``min_support``, :data:`MIN_SUPPORT` = 1) is cross-fitted on two halves
   of the validation records (even and odd positions): its own-F1 best value fitted on one half is scored on the
   other, both ways, and so is the global value fitted on each half. When the label's pooled out-of-half F1 at its
   own values beats the global value's, it gets the candidate that maximises its own F1 on all records (ties to the
   global value, then nearest 0.5, then lower); otherwise it keeps the global value. So a label gets a value of its
   own only when that value beats the global one on records it was not chosen on: the shrinkage toward the global
   value, strongest where a label has few gold items.
3. The guard: a label with gold items whose F1 is 0 at its value, where another candidate gives it more, gets its
   own best value. A label with gold items that scores 0 at every candidate is listed in ``details["unfound"]``
   (reports warn about it).

Why cross-fitting, measured (``bench/threshold_shrinkage.py --seeds 1 --checkpoints <the demo's last three>``,
2026-12-06, 2 loaded cores: nine tiny span models, DeBERTa- and BERT-style after 1, 2 and 4 epochs and the demo's
model after 6, 7 and 8; thresholds fitted on 8 draws of 20, 40 and 100 validation records, scored on 200 held-out
records). Held-out macro F1 at n = 20 / 40 / 100: cross-fitting 0.5272 / 0.5288 / 0.5294, no label case at F1 0
(of 288 per size); no shrinkage (own F1 from one gold item) 0.5262 / 0.5290 / 0.5296, one case at 0; a minimum
support of 20 / 40: 0.5196 / 0.5148 at n = 20 and 0.5287 / 0.5198 at n = 40 (at n = 100 every label has 40+ gold
items: no shrinkage, 0.5296); a support-weighted blend (k = 10 / 30) 0.5213 / 0.5159 at n = 20; the former rule
(each label maximising micro F1 with the others held) 0.4957 / 0.4952 / 0.4970 with 30 / 40 / 43 label cases at
F1 0, for 0.006-0.015 more micro F1. Cross-fitting is the best rule at 20 records, where shrinkage matters, the best
shrinkage rule at 40, and within 0.0002 of no shrinkage from 40 records (an oracle fitted on the held-out records
themselves: 0.5321).

Entities (per label), relations (per type) and structure fields (``"structure.field"``) are fitted; classification
counts do not depend on the span threshold and are scored as extracted. Deterministic; torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.label_order import SHUFFLED, extraction_schemas
from prefect_gliner2.session_core.scoring import Counts
from prefect_gliner2.session_core.threshold_table import (
    FLOOR,
    GRID,
    KIND_OF,
    LabelKey,
    ThresholdTable,
    label_name,
    with_threshold,
)
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, Thresholds

__all__ = [
    "FLOOR",
    "GRID",
    "MIN_SUPPORT",
    "best_index",
    "fit_table",
    "fit_thresholds",
    "fit_with_model",
    "guarded",
    "macro_f1",
    "micro_f1",
    "with_threshold",
]

MIN_SUPPORT = 1  # gold items a label needs to be cross-fitted for a value of its own (10 measured worse at n = 20)
DEFAULT_INDEX = GRID.index(DEFAULT_THRESHOLD)
ExtractWithConfidence = Callable[[list[str], list[dict[str, Any]], float], list[dict[str, Any]]]
Table = Mapping[LabelKey, Sequence[Counts]]


def best_index(scores: Sequence[float], preferred: float) -> int:
    """The grid index with the highest score; ties to the value nearest `preferred`, then nearest 0.5, then lower."""
    top = max(scores)
    tied = [i for i, s in enumerate(scores) if s == top]
    return min(tied, key=lambda i: (abs(GRID[i] - preferred), abs(GRID[i] - DEFAULT_THRESHOLD), GRID[i]))


def micro_f1(counts: Table, choice: Mapping[LabelKey, int], fixed: Counts | None = None) -> float:
    """Micro F1 of every label at its chosen grid index, plus the `fixed` (classification) counts."""
    total = fixed if fixed is not None else Counts()
    for key, at in counts.items():
        total = total + at[choice[key]]
    return total.f1


def macro_f1(counts: Table, choice: Mapping[LabelKey, int], fixed: Mapping[LabelKey, Counts]) -> float:
    """Macro F1 as ``ScoreReport.macro_f1`` counts it (labels with gold or predicted items), each label at its
    chosen grid index, classification tasks as extracted."""
    labels = [at[choice[key]] for key, at in counts.items()] + list(fixed.values())
    scored = [c.f1 for c in labels if c.support or c.predicted]
    return math.fsum(scored) / len(scored) if scored else 0.0


def guarded(counts: Table, choice: Mapping[LabelKey, int]) -> dict[LabelKey, int]:
    """`choice` with every label that has gold items and F1 0 at its value, where another value scores more, moved
    to its own best value (ties nearest the value it had)."""
    out = dict(choice)
    for key, at in counts.items():
        own = [c.f1 for c in at]
        if at[0].support and own[out[key]] == 0.0 and max(own) > 0.0:
            out[key] = best_index(own, GRID[out[key]])
    return out


def _global_index(counts: Table, fixed: Counts) -> int:
    scores = [micro_f1(counts, dict.fromkeys(counts, i), fixed) for i in range(len(GRID))]
    return best_index(scores, DEFAULT_THRESHOLD)


@dataclass(frozen=True)
class _Halves:
    """The two halves of the validation records (even and odd positions): each one's counts and global value."""

    counts: tuple[dict[LabelKey, list[Counts]], dict[LabelKey, list[Counts]]]
    global_index: tuple[int, int]

    @classmethod
    def of(cls, table: ThresholdTable) -> _Halves:
        halves = (range(0, table.records, 2), range(1, table.records, 2))
        counts = (table.counts(halves[0]), table.counts(halves[1]))
        fixed = (table.fixed(halves[0]), table.fixed(halves[1]))
        return cls(counts, (_global_index(counts[0], fixed[0]), _global_index(counts[1], fixed[1])))

    def own_holds_up(self, key: LabelKey) -> bool:
        """Does the label's own best value, chosen on one half, beat the global value chosen on that half, when both
        are scored on the other half (pooled over both directions)?"""
        own, shared = Counts(), Counts()
        for fit_on, score_on in ((0, 1), (1, 0)):
            g = self.global_index[fit_on]
            scored = self.counts[score_on][key]
            own = own + scored[best_index([c.f1 for c in self.counts[fit_on][key]], GRID[g])]
            shared = shared + scored[g]
        return own.f1 > shared.f1


def fit_table(table: ThresholdTable, *, min_support: int = MIN_SUPPORT) -> Thresholds:
    """Thresholds fitted on a :class:`ThresholdTable` (the module docstring's rule); ``details`` says how."""
    counts, fixed = table.counts(), table.fixed()
    g = _global_index(counts, fixed)
    choice = dict.fromkeys(table.labels, g)
    halves = _Halves.of(table)
    own = {key for key in table.labels if counts[key][0].support >= min_support and halves.own_holds_up(key)}
    for key in own:
        choice[key] = best_index([c.f1 for c in counts[key]], GRID[g])
    choice = guarded(counts, choice)
    per_label: dict[str, dict[str, float]] = {kind: {} for kind in KIND_OF.values()}
    for key, at in choice.items():
        if key in own or at != g:
            per_label[KIND_OF[key[0]]][key[1]] = GRID[at]
    fixed_labels = table.fixed_labels()
    details = {
        "records": table.records,
        "min_support": min_support,
        "label_order": SHUFFLED,
        "f1": micro_f1(counts, choice, fixed),
        "f1_global": micro_f1(counts, dict.fromkeys(counts, g), fixed),
        "f1_default": micro_f1(counts, dict.fromkeys(counts, DEFAULT_INDEX), fixed),
        "macro_f1": macro_f1(counts, choice, fixed_labels),
        "macro_f1_global": macro_f1(counts, dict.fromkeys(counts, g), fixed_labels),
        "macro_f1_default": macro_f1(counts, dict.fromkeys(counts, DEFAULT_INDEX), fixed_labels),
        "support": {label_name(key): counts[key][0].support for key in table.labels},
        "labels": {label_name(key): _label_details(counts[key], choice[key], g) for key in table.labels},
        "unfound": [label_name(k) for k in table.labels if counts[k][0].support and not any(c.tp for c in counts[k])],
    }
    return Thresholds(threshold=GRID[g], **per_label, fitted=True, details=details)


def _label_details(at: Sequence[Counts], chosen: int, g: int) -> dict[str, Any]:
    """One label's line in export.json: support, its value, and its F1 there, at the global value and at 0.5."""
    return {
        "support": at[0].support,
        "threshold": GRID[chosen],
        "f1": at[chosen].f1,
        "f1_global": at[g].f1,
        "f1_default": at[DEFAULT_INDEX].f1,
    }


def fit_thresholds(
    gold: Sequence[Mapping[str, Any]],
    predictions: Sequence[Mapping[str, Any]],
    *,
    min_support: int = MIN_SUPPORT,
) -> Thresholds:
    """Thresholds fitted on gold outputs and the payloads extracted for them with confidences at :data:`FLOOR` or
    lower (see the module docstring for the rule). ``details`` records the records, ``min_support``, the micro F1 at
    the fitted values (``f1``), at the fitted global value alone (``f1_global``) and at 0.5 (``f1_default``), the
    same for macro F1 (``macro_f1``, ``macro_f1_global``, ``macro_f1_default``), per label (``labels``) its support,
    value and F1 at it, at the global value and at 0.5, and the labels with gold items that score 0 at every
    candidate (``unfound``)."""
    return fit_table(ThresholdTable.of(gold, predictions), min_support=min_support)


def fit_with_model(
    pairs: Sequence[tuple[str, Mapping[str, Any]]],
    extract: ExtractWithConfidence,
    *,
    seed: int,
    min_support: int = MIN_SUPPORT,
) -> Thresholds:
    """Extract the (text, gold output) `pairs` once at :data:`FLOOR` with confidences (`extract(texts, schemas,
    threshold)`), each record's labels in its seeded shuffled order, and fit on the result."""
    outputs = [output for _, output in pairs]
    schemas = extraction_schemas(outputs, label_order=SHUFFLED, seed=seed)
    predictions = extract([text for text, _ in pairs], schemas, FLOOR)
    return fit_thresholds(outputs, predictions, min_support=min_support)
