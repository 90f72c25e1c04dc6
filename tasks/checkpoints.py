"""Checkpoint tasks: write a managed checkpoint after batch i, then move the durable cursor to it.

Order of commitment: the worker writes ``checkpoints/step-S-batch-I/`` atomically (files, then the hash index,
then a rename); only after it reports success does this task replace ``cursor.json``, and only forward. A crash at
any moment leaves either the previous cursor (the new checkpoint, if complete, is simply reused when the schedule
reaches it again) or the new one. Then retention prunes older checkpoints (``keep_checkpoints``; see
runtime/resources.py): only checkpoints before the committed cursor, never the one it names. Each committed
checkpoint emits a ``prefect-gliner2.checkpoint.committed`` event (runtime/events.py).

Background checkpoints (``background=True``): the checkpoint task returns once the worker has snapshotted the
state (pending, nothing committed); the ``commit checkpoint`` task later waits until the write is durable and then
does exactly what the synchronous task does after its write (``commit_written``). A kill before that commit leaves
the cursor on the previous checkpoint.
"""

from __future__ import annotations

import dataclasses

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from prefect_gliner2.runtime import faults, live_runs
from prefect_gliner2.runtime.events import checkpoint_event
from prefect_gliner2.runtime.protocol import Checkpoint, CheckpointResult, CommitCheckpoint
from prefect_gliner2.runtime.resources import prune_blobs, prune_checkpoints
from prefect_gliner2.runtime.rundir import DurableCursor
from prefect_gliner2.session_core.layout import checkpoint_name
from prefect_gliner2.tasks.training import RETRYING, call_worker

__all__ = ["checkpoint", "commit_checkpoint", "commit_written"]


@task(
    name="checkpoint",
    task_run_name="checkpoint step {step} batch {index}",
    cache_policy=NO_CACHE,
    **RETRYING,
)
def checkpoint(run_key: str, index: int, step: int, background: bool = False) -> CheckpointResult:
    """Checkpoint the session after batch `index` (optimizer step `step`) and commit the durable cursor; with
    `background`, return once the worker has snapshotted the state (pending: `commit_checkpoint` commits it)."""
    run = live_runs.get(run_key)
    run.lease.check()
    name = checkpoint_name(step, index)
    request = Checkpoint(index=index, uri=run.run_dir.checkpoint_uri(name), background=background)
    info = call_worker(run_key, request)
    if info.pending:
        get_run_logger().info("checkpoint %s snapshotted; its files are written while training continues", name)
        return dataclasses.replace(info, name=name)
    return commit_written(run_key, name, info)


@task(
    name="commit-checkpoint",
    task_run_name="commit checkpoint step {step} batch {index}",
    cache_policy=NO_CACHE,
    **RETRYING,
)
def commit_checkpoint(run_key: str, index: int, step: int) -> CheckpointResult:
    """Wait until the background write of the checkpoint after batch `index` is durable, then commit the cursor."""
    run = live_runs.get(run_key)
    run.lease.check()
    name = checkpoint_name(step, index)
    info = call_worker(run_key, CommitCheckpoint(index=index, uri=run.run_dir.checkpoint_uri(name)))
    return commit_written(run_key, name, info)


def commit_written(run_key: str, name: str, info: CheckpointResult) -> CheckpointResult:
    """After the worker reported checkpoint `name` written: move the durable cursor to it (only forward), prune by
    retention and emit the committed event. A checkpoint the worker could not write is logged and returned."""
    run = live_runs.get(run_key)
    logger = get_run_logger()
    if not info.committed:
        logger.warning("no checkpoint at batch %d: %s", info.index, info.reason)
        return info
    faults.hit("cursor", info.index)
    run.lease.check()
    cursor = DurableCursor(
        checkpoint=name,
        cursor=info.cursor,
        step=info.step,
        epoch=info.epoch,
        finished=info.finished,
        fingerprint=run.fingerprint,
    )
    info = dataclasses.replace(info, name=name, cursor_moved=run.run_dir.commit_cursor(cursor))
    logger.info("checkpoint %s committed%s", name, "" if info.cursor_moved else " (cursor already past it)")
    run.lease.check()
    pruned = prune_checkpoints(run.run_dir, run.keep_checkpoints, best_step=info.best_step)
    info = dataclasses.replace(info, pruned=tuple(pruned))
    if pruned:
        logger.info("retention (keep %s): removed %s", run.keep_checkpoints, ", ".join(pruned))
    if run.keep_checkpoints is not None:
        blobs = prune_blobs(run.run_dir)
        if blobs:
            logger.info("retention: removed best-weight blobs no checkpoint refers to: %s", ", ".join(blobs))
    emit_event(**checkpoint_event(run, info))
    return info
