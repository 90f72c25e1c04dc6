"""Two models compared for promotion: each scored record by record on the same records under the same conditions.

    scores = score_exports_here({"current": "registry/ner/versions/v000002", "candidate": "runs/x/export"},
                                {"test_data": "test.jsonl", "guard_data": "guard.jsonl"})
    decision = decide_from_scores(scores, PromotionRule(), test="test_data", guard="guard_data")
    decision.promote, decision_text(decision)

The conditions are the same for every model: every record's labels asked in the same seeded random order (the
record's position and ``seed``, trial 0: what validation does, ``evaluation.score_extraction``), each model with its
own thresholds (recorded in its ``export.json``, else ``fallback_threshold``), on the same records, with per-record
counts kept for the paired bootstrap (:func:`~prefect_gliner2.session_core.promotion.decide_promotion`).

Two ways to load the models, one way to score them: :func:`score_exports_here` loads export or registry directories
as they are (``prefect-gliner2 compare``); :func:`score_sessions_here` loads each one as a training run's
``init_weights`` into a session over the base model (the retraining flow, in the candidate's session worker or a
spawned child, so the candidate scores exactly what its validation measured). Prefect-free; torch loads inside the
scoring functions only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from prefect_gliner2.runtime.model_sources import parse_tiny
from prefect_gliner2.session_core.evaluation import PER_LABEL_KEY, Extract, Pair, score_extraction
from prefect_gliner2.session_core.promotion import PromotionDecision, PromotionRule, ScoredSet, decide_promotion
from prefect_gliner2.session_core.record_counts import RecordCounts
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, Thresholds, fixed, read_thresholds

__all__ = [
    "BASE",
    "CANDIDATE",
    "COUNTS_KEY",
    "CURRENT",
    "decide_from_scores",
    "load_pairs",
    "metrics_only",
    "model_thresholds",
    "score_exports_here",
    "score_models",
    "score_sessions_here",
]

CANDIDATE, CURRENT, BASE = "candidate", "current", "base"  # the roles a decision knows
COUNTS_KEY = "counts"  # RecordCounts.to_dict() inside a model's scores on one set
Raw = Callable[[list[str], list[dict[str, Any]], float], list[dict[str, Any]]]  # (texts, schemas, threshold)
# Opens (role, source) for scoring: yields its raw extraction and what to record about the loaded weights.
Opener = Callable[[str, str], AbstractContextManager[tuple[Raw, dict[str, Any]]]]


def model_thresholds(source: str, fallback: float) -> tuple[Thresholds, str]:
    """The thresholds `source` recorded in its export.json and "recorded", else one `fallback` for every label and
    "fallback" (a base model, a Hugging Face id, an export written before thresholds were recorded)."""
    if parse_tiny(source) is None and ("://" in source or os.path.isdir(os.path.expanduser(source))):
        recorded = read_thresholds(os.path.expanduser(source))
        if recorded is not None:
            return recorded, "recorded"
    return fixed(fallback), "fallback"


def load_pairs(data: str | list[str], what: str) -> list[Pair]:
    """The (text, gold output) pairs of JSONL path(s) or URL(s), in file order."""
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records

    return to_pairs(load_records(data, what=what).examples())


def score_models(
    models: Mapping[str, str],
    sets: Mapping[str, list[Pair]],
    opener: Opener,
    *,
    seed: int = 0,
    fallback_threshold: float = DEFAULT_THRESHOLD,
) -> dict[str, dict[str, dict[str, Any]]]:
    """{set: {role: scores}} for each {role: model source} on each {set: pairs}: the metrics, the per-label rows,
    the thresholds used and where they came from, and the per-record counts (:data:`COUNTS_KEY`)."""
    out: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in sets}
    for role, source in models.items():
        thresholds, origin = model_thresholds(source, fallback_threshold)
        with opener(role, source) as (raw, loaded):
            extract = _thresholded(raw, thresholds)
            for name, pairs in sets.items():
                report = score_extraction(pairs, extract, seed=seed, per_record=True)
                out[name][role] = {
                    **report.metrics(),
                    PER_LABEL_KEY: report.rows(),
                    "examples": len(pairs),
                    "uri": source,
                    "thresholds": thresholds.to_dict(),
                    "thresholds_from": origin,
                    **loaded,
                    COUNTS_KEY: RecordCounts.from_report(report).to_dict(),
                }
    return out


def _thresholded(raw: Raw, thresholds: Thresholds) -> Extract:
    """Extraction with the model's own thresholds: the global one per call, the per-label ones in the schemas."""

    def extract(texts: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return raw(texts, [thresholds.apply(schema) for schema in schemas], thresholds.threshold)

    return extract


def score_exports_here(
    models: Mapping[str, str],
    data: Mapping[str, str | list[str]],
    *,
    seed: int = 0,
    fallback_threshold: float = DEFAULT_THRESHOLD,
    batch_size: int = 8,
    device: str | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score export or registry directories (or a model source: ``tiny:span``, a Hugging Face id) loaded as they
    are, with gliner2's batched inference, in this process (imports torch)."""
    from prefect_gliner2.training.inference import model_extractor

    @contextmanager
    def opener(role: str, source: str) -> Iterator[tuple[Raw, dict[str, Any]]]:
        model = _load_export(source)
        if device is not None:
            model = model.to(device)
        model.eval()

        def raw(texts: list[str], schemas: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
            return model_extractor(model, threshold=threshold, batch_size=batch_size)(texts, schemas)

        yield raw, {}

    sets = {name: load_pairs(paths, name) for name, paths in data.items()}
    return score_models(models, sets, opener, seed=seed, fallback_threshold=fallback_threshold)


def _load_export(source: str) -> Any:
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training.weights import load_exported_model

    directory = os.path.expanduser(source)
    if "://" in source or os.path.isdir(directory):
        return load_exported_model(source if "://" in source else directory)
    return load_model(source)


def score_sessions_here(
    models: Mapping[str, str | None],
    base_model: str,
    data: Mapping[str, str | list[str]],
    config: Mapping[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score model directories loaded as a run's ``init_weights`` into a session over `base_model` (None: the base
    model itself), at the config's ``eval_batch_size``, label-order ``seed`` and, without recorded thresholds, its
    ``eval_threshold``: a candidate scored on its validation data gets its own validation F1. Imports torch."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.runtime.worker_setup import init_weights_dir
    from prefect_gliner2.training import TrainingConfig, TrainingSession

    torch.set_num_threads(int(cpu_threads))
    settings = TrainingConfig.from_dict(dict(config))
    sources = {role: uri if uri is not None else base_model for role, uri in models.items()}

    @contextmanager
    def opener(role: str, source: str) -> Iterator[tuple[Raw, dict[str, Any]]]:
        session = TrainingSession(load_model(base_model), settings, max_steps=1, device=device)
        try:
            loaded: dict[str, Any] = {}
            if models[role] is not None:
                loaded = session.load_weights(init_weights_dir(source, bool(settings.use_lora)))
            weights = {
                "base_model_hash": session.provenance["base_model_hash"],
                "weights_sha256": loaded.get("weights_sha256") or loaded.get("adapter_sha256"),
            }

            def raw(texts: list[str], schemas: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
                return session.extract(texts, schemas, threshold=threshold, batch_size=settings.eval_batch_size)

            yield raw, weights
        finally:
            session.close()

    sets = {name: load_pairs(paths, name) for name, paths in data.items()}
    return score_models(
        sources, sets, opener, seed=int(settings.seed), fallback_threshold=float(settings.eval_threshold)
    )


def decide_from_scores(
    scores: Mapping[str, Mapping[str, Mapping[str, Any]]],
    rule: PromotionRule,
    *,
    test: str,
    guard: str | None = None,
) -> PromotionDecision:
    """The promotion decision on :func:`score_models`' scores: the candidate against the current model (and the base
    model beside them, when scored) on the `test` set and, when named, the `guard` set."""

    def scored(name: str) -> ScoredSet:
        roles = scores[name]

        def counts(role: str) -> RecordCounts | None:
            return RecordCounts.from_dict(roles[role][COUNTS_KEY]) if role in roles else None

        candidate = counts(CANDIDATE)
        assert candidate is not None, f"no candidate scores on {name}"
        return ScoredSet(name, candidate, counts(CURRENT), counts(BASE))

    return decide_promotion(scored(test), guard=scored(guard) if guard is not None else None, rule=rule)


def metrics_only(scores: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """One set's {role: scores} without the per-record counts (for lineage, events and reports)."""
    return {role: {k: v for k, v in values.items() if k != COUNTS_KEY} for role, values in scores.items()}
