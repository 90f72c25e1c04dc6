"""Batch tasks: "advance the session through batch i" (or through a group of batches), cached and retry-safe.

Why a cache hit can never skip work the live session needs, twice over:

1. Every worker operation is a *position*, not a delta: ``advance(first, through)`` trains until the session's
   cursor is past ``through``, replaying from wherever the worker restored; validation, checkpoint and export
   operations advance to their position first. A skipped (cached) task leaves its work to the next operation.
2. The cache key is ``sha256(run key, manifest content address, operation, position, worker incarnation)``. The
   incarnation is the checkpoint the live worker restored from plus a nonce drawn at each worker start, so a
   recorded result is reused only by the very worker process that produced it (e.g. when a flow retry in the same
   process finds its worker still alive), never after a restore.

Transient failures (``WorkerDied``, unexpected worker exceptions) are retried; the retry starts a fresh worker
from the newest committed checkpoint. Deterministic ``SessionCoreError``s fail the task at once.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any, TypeVar

from prefect import get_run_logger, task

from prefect_gliner2.runtime import live_runs
from prefect_gliner2.runtime.errors import retry_if_transient
from prefect_gliner2.runtime.protocol import Advance, AdvanceResult, Request

__all__ = ["TASK_RETRIES", "call_worker", "position_cache_key", "train_batches"]

R = TypeVar("R")
TASK_RETRIES = 3
RETRY_DELAY_SECONDS = 1.0
CACHE_EXPIRATION = timedelta(days=7)


def position_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """Cache key of a batch/validation task (see the module docstring); None (no caching) without a live worker."""
    run = live_runs.lookup(parameters["run_key"])
    if run is None:
        return None
    incarnation = run.worker.incarnation
    if incarnation is None:
        return None
    op = context.task.name if context is not None else "?"
    position = (
        f"{parameters.get('first', parameters.get('index'))}-{parameters.get('through', parameters.get('index'))}"
    )
    material = "\x1f".join(["prefect-gliner2/v1", run.run_key, run.content_address, op, position, incarnation])
    return hashlib.sha256(material.encode()).hexdigest()


def call_worker(run_key: str, request: Request[R]) -> R:
    """Run one worker request for a task, starting (and logging) a fresh worker if the last one died; returns the
    protocol's result for that request."""
    run = live_runs.get(run_key)
    logger = get_run_logger()
    if not run.worker.answered(request) and run.worker.start():
        logger.warning(
            "session worker for run %s (re)started from %s; replaying deterministically from there",
            run_key,
            run.worker.restored_from or "the start of the plan",
        )
    return run.worker.call(request)


# Operations on the worker: transient failures (worker death) are retried from the newest checkpoint,
# deterministic ones fail at once. Position operations are cached per worker incarnation (position_cache_key).
RETRYING: dict[str, Any] = {
    "retries": TASK_RETRIES,
    "retry_delay_seconds": RETRY_DELAY_SECONDS,
    "retry_condition_fn": retry_if_transient,
}
POSITION_TASK: dict[str, Any] = {
    "cache_key_fn": position_cache_key,
    "cache_expiration": CACHE_EXPIRATION,
    "persist_result": True,
    **RETRYING,
}


@task(
    name="train-batches",
    task_run_name="batches {first}-{through}",
    **POSITION_TASK,
)
def train_batches(run_key: str, first: int, through: int) -> AdvanceResult:
    """Advance the session through batch `through` (training `first`..`through`); returns their update metrics."""
    result = call_worker(run_key, Advance(first=first, through=through))
    if result.replayed:
        logger = get_run_logger()
        logger.info("replayed %d batch(es) before batch %d from the restored checkpoint", result.replayed, first)
    return result
