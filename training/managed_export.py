"""What a managed run exports: the best or final weights, with the extraction thresholds fitted on its validation
records and the schema it was trained on (``export.json``); the glue behind ``ManagedTraining.export_weights``,
``fit_thresholds`` and ``trained_schema``, and the validation records those thresholds are fitted on (batched, hashed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.pairs import to_pairs
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
from prefect_gliner2.session_core.scoring import DatasetSchema, inference_schema
from prefect_gliner2.session_core.threshold_fit import fit_with_model
from prefect_gliner2.session_core.thresholds import Thresholds
from prefect_gliner2.training.weights import export_weights, state_loaded

if TYPE_CHECKING:
    from prefect_gliner2.training.native_save import SameBytes
    from prefect_gliner2.training.session import TrainingSession

__all__ = ["eval_batches", "export_managed", "fit_thresholds", "records_hash", "trained_schema"]


def export_managed(
    session: TrainingSession,
    uri: str,
    *,
    best: tuple[dict[str, torch.Tensor], int] | None,
    fit: Callable[[dict[str, torch.Tensor] | None, int], Thresholds | None],
    schema: dict[str, Any],
    which: str = "best",
    merged: bool = False,
    before_commit: Callable[[], None] | None = None,
    same_bytes: SameBytes | None = None,
) -> dict[str, Any]:
    """Export the `best` model's (state, step) (default, when validation selected one) or the session's final
    model; export.json names the step its weights come from, the thresholds `fit` gives for them (None without
    validation extraction) and the trained `schema`.

    `before_commit` runs when the export's files are written, just before they are committed; `same_bytes`: see
    ``weights.export_weights``."""
    if which not in ("best", "final"):
        raise ConfigError(f"which must be 'best' or 'final', got {which!r}")
    chosen = best if which == "best" else None
    state, step = chosen if chosen is not None else (None, session.step)
    fitted = fit(state, step)
    return export_weights(
        session,
        uri,
        merged=merged,
        state=state,
        label="best" if chosen is not None else "final",
        step=step,
        thresholds=fitted.to_dict() if fitted is not None else None,
        schema=schema,
        before_commit=before_commit,
        same_bytes=same_bytes,
    )


def trained_schema(plan: ManagedTrainingPlan) -> dict[str, Any]:
    """What the model was trained to extract: every entity label (with its description), relation type and
    structure of the training records, as a gliner2 schema dict (export.json ``schema``; ``extract``'s default
    labels). Classification tasks are per record and left out."""
    outputs = [output for _, output in to_pairs(plan.records.examples())]
    return inference_schema({}, DatasetSchema.of(outputs))


def fit_thresholds(
    session: TrainingSession,
    batches: Sequence[Sequence[tuple[str, dict[str, Any]]]],
    state: dict[str, torch.Tensor] | None = None,
    step: int | None = None,
) -> Thresholds | None:
    """Extraction thresholds fitted on the validation records `batches` for `state` (the live weights when None),
    see :mod:`.threshold_fit`; None without validation records or with ``eval_extraction`` off."""
    if not batches or not session.config.eval_extraction:
        return None
    pairs = [pair for batch in batches for pair in batch]
    size = max(len(batch) for batch in batches)

    def extract(texts: list[str], schemas: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
        return session.extract(texts, schemas, threshold=threshold, batch_size=size, include_confidence=True)

    with state_loaded(session, state):
        fitted = fit_with_model(pairs, extract, seed=int(session.config.seed))
    return dataclasses.replace(fitted, details={**fitted.details, "step": step})


def eval_batches(examples: Any, batch_size: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """The validation records as (text, output) pairs in batches of `batch_size` (none for no examples)."""
    if examples is None:
        return []
    records = getattr(examples, "records", examples)
    pairs = to_pairs(list(records)) if len(records) else []
    return [pairs[i : i + batch_size] for i in range(0, len(pairs), batch_size)]


def records_hash(batches: Sequence[Sequence[tuple[str, dict[str, Any]]]]) -> str:
    """A digest of the validation records, in order (a resumed run checks it names the same validation set)."""
    digest = hashlib.sha256()
    for batch in batches:
        for text, output in batch:
            digest.update(json.dumps([text, output], ensure_ascii=False).encode())  # key order is data: kept
            digest.update(b"\n")
    return digest.hexdigest()
