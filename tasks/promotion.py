"""The retraining flow's comparison scores, computed in a spawned child process (torch never loads in the flow).

    scores = score_for_promotion({"candidate": ".../export", "current": ".../versions/v000002", "base": None},
                                 base_model="tiny:span", data={"test_data": "test.jsonl"}, config=config.to_dict())
    scores["test_data"]["candidate"]["eval_f1"], scores["test_data"]["candidate"]["counts"]

What is scored, and how, is :func:`prefect_gliner2.runtime.compare.score_sessions_here`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.runtime.compare import score_sessions_here

__all__ = ["score_for_promotion"]


@task(name="score-for-promotion", cache_policy=NO_CACHE, persist_result=False)
def score_for_promotion(
    models: Mapping[str, str | None],
    base_model: str,
    data: Mapping[str, str | list[str]],
    config: Mapping[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """{set: {role: scores with per-record counts}} for each {role: model directory (None: the base model)} on each
    {set: records}, computed in one fresh spawned process."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        results: dict[str, dict[str, dict[str, Any]]] = pool.submit(
            score_sessions_here, dict(models), base_model, dict(data), dict(config), cpu_threads, device
        ).result()
    logger = get_run_logger()
    for name, roles in results.items():
        for role, scores in roles.items():
            logger.info(
                "%s (%s) on %s (%d records): F1 %.4f (P %.4f, R %.4f) at thresholds from %s",
                role,
                scores["uri"],
                name,
                scores["examples"],
                scores["eval_f1"],
                scores["eval_precision"],
                scores["eval_recall"],
                scores["thresholds_from"],
            )
    return results
