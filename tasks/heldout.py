"""Held-out evaluation of model directories in a spawned child process (torch never loads in the flow process).

    results = evaluate_models({"candidate": ".../export", "current": ".../versions/v000002"},
                              base_model="tiny:span", valid_data="data/valid.jsonl", config=config.to_dict())
    results["candidate"]["eval_f1"]

Each model is loaded the way a run's ``init_weights`` is: the base model, then ``session.load_weights`` of the
directory (its ``adapter/`` for a LoRA config). The metrics are the ones validation computes during training
(`session_core.evaluation.evaluate_session`: native eval-mode losses averaged over ``eval_batch_size`` batches and
extraction precision/recall/F1), so both models are scored on exactly the same records. Each extracts at the
thresholds its export.json records (fitted on its own validation data at export), else at ``eval_threshold``;
``threshold=`` replaces both.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.runtime.heldout import evaluate_models_here
from prefect_gliner2.session_core.thresholds import describe

__all__ = ["evaluate_models"]


@task(name="evaluate-models", cache_policy=NO_CACHE, persist_result=False)
def evaluate_models(
    models: Mapping[str, str],
    base_model: str,
    valid_data: str | list[str],
    config: Mapping[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """{label: metrics} for each {label: model directory}, computed in one fresh spawned process; each model at
    its recorded (fitted) thresholds unless an explicit `threshold` is given."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        results: dict[str, Any] = pool.submit(
            evaluate_models_here, dict(models), base_model, valid_data, dict(config), cpu_threads, device, threshold
        ).result()
    logger = get_run_logger()
    for label, metrics in results.items():
        logger.info(
            "%s (%s) on %d held-out examples: F1 %s (P %s, R %s), eval_loss %.6f; %s %s",
            label,
            metrics["uri"],
            metrics["examples"],
            _rounded(metrics.get("eval_f1")),
            _rounded(metrics.get("eval_precision")),
            _rounded(metrics.get("eval_recall")),
            metrics["eval_loss"],
            metrics["threshold_source"],
            describe(metrics["thresholds"]),
        )
    return results


def _rounded(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"
