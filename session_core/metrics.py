"""Validation metric names in one place: which keys validation reports and which direction is better.

Torch-free. The managed driver, held-out evaluation, the flows' reports and the retraining decision all read their key
lists from here, so a metric is spelled once.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_METRIC",
    "EVAL_KEYS",
    "EXTRACTION_KEYS",
    "FITTED_KEYS",
    "KIND_F1_KEYS",
    "LOSS_KEYS",
    "LOSS_SOURCES",
    "ORDER_KEYS",
    "SCORE_KEYS",
    "greater_is_better_for",
    "is_extraction_metric",
]

# eval key -> the component gliner2's forward returns (native eval-mode losses, averaged over eval batches)
LOSS_SOURCES: dict[str, str] = {
    "eval_loss": "total_loss",
    "eval_classification_loss": "classification_loss",
    "eval_structure_loss": "structure_loss",
    "eval_count_loss": "count_loss",
}
LOSS_KEYS: tuple[str, ...] = tuple(LOSS_SOURCES)

# task kind (scoring.KINDS) -> its micro F1 key
KIND_F1_KEYS: dict[str, str] = {
    "entities": "eval_entity_f1",
    "relations": "eval_relation_f1",
    "classifications": "eval_classification_f1",
    "structures": "eval_structure_f1",
}
# micro precision / recall / F1 over every task kind, the per-kind F1s and the macro F1 over labels: what one scoring
# pass gives, asking each record's labels in its seeded random order (label_order.py; trial 0)
SCORE_KEYS: tuple[str, ...] = ("eval_precision", "eval_recall", "eval_f1", *KIND_F1_KEYS.values(), "eval_macro_f1")
# label-order robustness: micro F1 with the labels in the data set's own order (the order training records list them),
# and the lowest and highest micro F1 over `label_order_trials` seeded random orders (trial 0 is eval_f1's)
ORDER_KEYS: tuple[str, ...] = ("eval_f1_canonical", "eval_f1_order_min", "eval_f1_order_max")
# what the shipped model scores: micro and macro F1 at the thresholds fitted on the validation records themselves
# (one more extraction at the fit's floor, fitted_scores.py), the thresholds a run's export.json records
FITTED_KEYS: tuple[str, ...] = ("eval_f1_fitted", "eval_macro_f1_fitted")
EXTRACTION_KEYS: tuple[str, ...] = SCORE_KEYS + ORDER_KEYS + FITTED_KEYS
EVAL_KEYS: tuple[str, ...] = LOSS_KEYS + EXTRACTION_KEYS

# best selection and early stopping follow the F1 of the model a run ships, not an F1 at 0.5 that swings between 0 and
# a fair score from one validation to the next while the model's scores settle
DEFAULT_METRIC = "eval_f1_fitted"


def is_extraction_metric(name: str) -> bool:
    """True for the metrics computed from extractions (precision, recall, F1), False for losses."""
    return name in EXTRACTION_KEYS


def greater_is_better_for(name: str) -> bool:
    """Extraction metrics are better when higher, losses when lower; unknown names are refused by the caller."""
    return is_extraction_metric(name)
