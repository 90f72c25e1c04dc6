"""The retraining flow's comparison scores, computed in the candidate's session worker, else in a spawned child
process (torch never loads in the flow).

    scores = score_for_promotion({"candidate": ".../export", "current": ".../versions/v000002", "base": None},
                                 base_model="tiny:span", data={"test_data": "test.jsonl"}, config=config.to_dict(),
                                 run_key=run_key)
    scores["test_data"]["candidate"]["eval_f1"], scores["test_data"]["candidate"]["counts"]

What is scored, and how, is :func:`prefect_gliner2.runtime.compare.score_sessions_here`. Where: the session worker
that trained the candidate when its run handed it over (``runtime.handover``: a process that has imported torch,
transformers and gliner2 already; it releases the run's session first), else one fresh spawned process (a candidate
run found complete, a worker that died).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.runtime import handover
from prefect_gliner2.runtime.compare import score_sessions_here
from prefect_gliner2.runtime.errors import WorkerDied
from prefect_gliner2.runtime.protocol import Score

__all__ = ["score_for_promotion", "score_in_child"]

Scores = dict[str, dict[str, dict[str, Any]]]


@task(name="score-for-promotion", cache_policy=NO_CACHE, persist_result=False)
def score_for_promotion(
    models: Mapping[str, str | None],
    base_model: str,
    data: Mapping[str, str | list[str]],
    config: Mapping[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
    run_key: str | None = None,
) -> Scores:
    """{set: {role: scores with per-record counts}} for each {role: model directory (None: the base model)} on each
    {set: records}, computed in the session worker of run `run_key` when it was handed over, else in one fresh
    spawned process."""
    logger = get_run_logger()
    args = (dict(models), base_model, dict(data), dict(config), cpu_threads, device)
    worker = handover.take(run_key) if run_key is not None else None
    results: Scores | None = None
    if worker is not None:
        try:
            results = worker.call(Score(*args)).scores
            logger.info("scored in the candidate's session worker (pid %s)", worker.pid)
        except WorkerDied as exc:
            logger.warning("the session worker died while scoring (%s): scoring in a fresh process", exc)
        finally:
            worker.close(wait=False)
    if results is None:
        results = score_in_child(*args)
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


def score_in_child(
    models: dict[str, str | None],
    base_model: str,
    data: dict[str, str | list[str]],
    config: dict[str, Any],
    cpu_threads: int = 1,
    device: str | None = None,
) -> Scores:
    """``score_sessions_here`` in one fresh spawned process."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        results: Scores = pool.submit(
            score_sessions_here, models, base_model, data, config, cpu_threads, device
        ).result()
    return results
