"""Held-out evaluation of model directories, in the process that calls it (imports torch; Prefect-free).

``prefect_gliner2.tasks.heldout.evaluate_models`` runs this in a spawned child so torch never loads in the flow
process. Each model is loaded the way a run's ``init_weights`` is and scored by the same function validation uses
(``session_core.evaluation.evaluate_session``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_gliner2.session_core.thresholds import Thresholds, fixed, read_thresholds

__all__ = ["evaluate_models_here", "model_thresholds"]


def model_thresholds(uri: str, explicit: float | None, default: float) -> tuple[Thresholds, str]:
    """The thresholds to score the model at `uri` with, and where they come from: ``"explicit"`` (the caller's
    value), ``"fitted"`` (its export.json's), else ``"default"`` (`default`, the config's eval_threshold)."""
    if explicit is not None:
        return fixed(explicit), "explicit"
    recorded = read_thresholds(uri)
    return (recorded, "fitted") if recorded is not None else (fixed(default), "default")


def evaluate_models_here(
    models: Mapping[str, str],
    base_model: str,
    valid_data: str | list[str],
    config: Mapping[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """The evaluation itself (runs in the child; imports torch). Each model extracts with the thresholds its
    export.json records (fitted on its validation data), else at the config's ``eval_threshold``; an explicit
    `threshold` replaces both."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.runtime.worker_setup import init_weights_dir
    from prefect_gliner2.session_core import TrainingConfig, TrainingSession
    from prefect_gliner2.session_core.evaluation import evaluate_session
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records

    torch.set_num_threads(int(cpu_threads))
    settings = TrainingConfig.from_dict(dict(config))
    pairs = to_pairs(load_records(valid_data, what="validation").examples())
    size = settings.eval_batch_size
    batches = [pairs[i : i + size] for i in range(0, len(pairs), size)]
    results: dict[str, Any] = {}
    for label, uri in models.items():
        session = TrainingSession(load_model(base_model), settings, max_steps=1, device=device)
        try:
            loaded = session.load_weights(init_weights_dir(uri, bool(settings.use_lora)))
            chosen, source = model_thresholds(uri, threshold, float(settings.eval_threshold))
            metrics = evaluate_session(
                session,
                batches,
                extraction=bool(settings.eval_extraction),
                threshold=chosen,
                seed=int(settings.seed),
                label_order_trials=int(settings.label_order_trials),
            )
            metrics.update(
                uri=uri,
                examples=len(pairs),
                base_model_hash=session.provenance["base_model_hash"],
                weights_sha256=loaded.get("weights_sha256") or loaded.get("adapter_sha256"),
                thresholds=chosen.to_dict(),
                threshold_source=source,
            )
            results[label] = metrics
        finally:
            session.close()
    return results
