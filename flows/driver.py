"""Runs a plan's units through the Prefect tasks, strictly in order, optionally pipelined.

Pipelining (``pipeline_depth=d``): before the task of unit k runs, units k..k+d are already sent to the worker, so
the worker computes while Prefect records task runs; each task then joins its pre-sent operation instead of sending
it. The worker executes operations in sending order, so checkpoints still land exactly where the schedule puts
them; after a worker restart, pre-sent operations are sent again, in order, to the new incarnation.

Task grain (``batches_per_task``, a ``runtime.schedule.TaskGrain``): each advance result tells the grain how long
the worker took for its batches; an automatic grain then sizes the units formed next (logged when it changes).

Background checkpoints (``background_checkpoints=True``): a checkpoint unit returns once the worker has taken its
snapshot, and training goes on while the worker writes it. The driver commits it (``commit checkpoint`` task: the
durable cursor moves, retention prunes, the event is emitted) as soon as its index exists after a later unit, and
always before the next checkpoint unit, before an early-stop checkpoint and before the drive ends (the export).
When pipelining, the next checkpoint unit is not sent ahead before that commit (see ``_presubmit``).

Pausing (``pause_at=i``, a validation batch): the drive ends after the validation at batch i and a checkpoint there
(the schedule's own, or one added); nothing after it is formed or sent ahead, so the run's state at the pause is the
one an uninterrupted run has at that batch, and the same run key continues it from there exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prefect import get_run_logger

from prefect_gliner2.flows.reporting import RunReporter
from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.live_runs import LiveRun
from prefect_gliner2.runtime.protocol import AdvanceResult, CheckpointResult, Request, ValidateResult
from prefect_gliner2.runtime.schedule import CheckpointCadence, TaskGrain, Unit, unit_op, units
from prefect_gliner2.session_core.checkpoint import checkpoint_exists
from prefect_gliner2.tasks.checkpoints import checkpoint, commit_checkpoint
from prefect_gliner2.tasks.training import train_batches
from prefect_gliner2.tasks.validation import validate

__all__ = ["DriveResult", "drive", "run_unit"]


@dataclass
class DriveResult:
    stopped_early: bool = False
    last_checkpoint: CheckpointResult | None = None
    units_run: int = 0
    paused: ValidateResult | None = None  # the validation the drive paused after (``pause_at``)


def run_unit(
    run_key: str, unit: Unit, *, background: bool = False
) -> AdvanceResult | ValidateResult | CheckpointResult:
    """Run one unit as its Prefect task (synchronously, in the flow's thread)."""
    if unit.kind == "advance":
        return train_batches(run_key, unit.first, unit.through)
    if unit.kind == "validate":
        return validate(run_key, unit.through)
    return checkpoint(run_key, unit.through, unit.step, background)


class _Checkpoints:
    """The driver's checkpoint results: the newest committed one, and the one background write awaiting commit."""

    def __init__(self, run: LiveRun, reporter: RunReporter, outcome: DriveResult) -> None:
        self.run, self.reporter, self.outcome = run, reporter, outcome
        self.waiting: CheckpointResult | None = None

    def record(self, result: CheckpointResult) -> None:
        if result.pending:
            self.waiting = result
            return
        self.outcome.last_checkpoint = result
        self.reporter.checkpoint(result)

    def commit_if_durable(self) -> None:
        """Commit the waiting checkpoint if its index exists already (a stat: nothing is waited for)."""
        if self.waiting is not None and checkpoint_exists(self.waiting.uri):
            self.commit()

    def commit(self) -> None:
        """Commit the waiting checkpoint, waiting for its write if needed."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            self.record(commit_checkpoint(self.run.run_key, waiting.index, waiting.step))


def drive(
    run: LiveRun,
    start: int,
    *,
    batches_per_task: int | TaskGrain,
    checkpoint_every: int | Literal["auto"],
    pipeline_depth: int,
    validate_runs: bool,
    reporter: RunReporter,
    then: Request[Any] | None = None,
    background_checkpoints: bool = False,
    pause_at: int | None = None,
) -> DriveResult:
    """Run every unit from batch `start` to the end of the plan (or to early stopping, or to the pause after the
    validation at batch `pause_at`, checkpointed there: ``DriveResult.paused``).

    `then` is the worker request that follows the last unit (the export); when pipelining, it is sent ahead too
    (never when pausing). With `background_checkpoints`, no checkpoint is left uncommitted when this returns.
    """
    plan = run.plan
    grain = batches_per_task if isinstance(batches_per_task, TaskGrain) else TaskGrain(batches_per_task)
    cadence = CheckpointCadence.of(checkpoint_every, grain)
    source = units(plan, start, batches_per_task=grain, checkpoint_every=cadence, validate=validate_runs)
    if pause_at is not None:
        source, then = _until(source, pause_at, plan.step_after(pause_at)), None
    pending: deque[Unit] = deque()
    sent: dict[Unit, str] = {}
    outcome = DriveResult()
    checkpoints = _Checkpoints(run, reporter, outcome)
    exhausted = False
    while True:
        exhausted = exhausted or _refill(source, pending, pipeline_depth + 1)
        if not pending:
            checkpoints.commit()
            return outcome
        if pipeline_depth:
            all_sent = _presubmit(run, pending, sent, background_checkpoints, checkpoints.waiting is not None)
            if exhausted and all_sent and then is not None and run.worker.alive:
                run.worker.submit(then)  # joined by the export task (or re-sent by it)
        unit = pending.popleft()
        if unit.kind == "checkpoint":
            checkpoints.commit()  # never two snapshots: the previous one is durable and committed first
        result = run_unit(run.run_key, unit, background=background_checkpoints)
        if sent.pop(unit, None) is not None:
            # a cached task never consumed its pre-sent request
            run.worker.release(unit_op(unit, run.run_dir, background=background_checkpoints))
        outcome.units_run += 1
        faults.hit("unit", unit.through)
        if isinstance(result, AdvanceResult):
            _observe(grain, result)
            reporter.progress(result)
        elif isinstance(result, CheckpointResult):
            checkpoints.record(result)
        else:
            reporter.validation(result)
            if pause_at is not None and result.index == pause_at and not result.stopped_early:
                outcome.paused = result
            if result.stopped_early:
                outcome.stopped_early = True
                checkpoints.commit()
                _final_checkpoint(run, unit, pending, checkpoints, background_checkpoints)
                return outcome
        if not isinstance(result, CheckpointResult):
            checkpoints.commit_if_durable()


def _until(source: Iterator[Unit], pause_at: int, step: int) -> Iterator[Unit]:
    """`source`'s units through the validation at batch `pause_at` and a checkpoint there (the schedule's own when
    it has one at that batch, else one added), then no more."""
    for unit in source:
        if unit.kind == "checkpoint" and unit.through == pause_at:
            yield unit
            return
        if unit.first > pause_at:
            break
        yield unit
    yield Unit("checkpoint", pause_at, pause_at, step)


def _refill(source: Iterator[Unit], pending: deque[Unit], size: int) -> bool:
    """Top `pending` up to `size` units from `source`; True once `source` is exhausted."""
    while len(pending) < size:
        upcoming = next(source, None)
        if upcoming is None:
            return True
        pending.append(upcoming)
    return False


def _observe(grain: TaskGrain, result: AdvanceResult) -> None:
    """Tell the grain the worker's time for this unit; log when an automatic grain changes."""
    before = grain.batches
    grain.observe(result.trained, result.seconds)
    if grain.batches != before:
        get_run_logger().info(
            "batches per task: %d (measured %.3f s per batch; tasks of about %.1f s)",
            grain.batches,
            grain.per_batch_seconds or 0.0,
            grain.batches * (grain.per_batch_seconds or 0.0),
        )


def _presubmit(run: LiveRun, pending: deque[Unit], sent: dict[Unit, str], background: bool, uncommitted: bool) -> bool:
    """Send the pending units ahead, in order; True when all of them are sent to the live incarnation.

    With background checkpoints, a checkpoint unit is not sent ahead while an earlier background checkpoint is not
    committed (`uncommitted`: one awaits its commit; or an earlier pending unit is a checkpoint): the flow's commit
    of the earlier one must reach the worker before the later write starts, or a failure of the later write (raised
    by whatever operation follows it, after which the worker exits) could leave a durable checkpoint uncommitted.
    The units behind it wait too (the worker executes in sending order)."""
    worker = run.worker
    if not worker.alive:
        return False  # the next task restarts it (and logs why); pre-sending resumes after that
    incarnation = worker.incarnation
    if incarnation is None:
        return False
    for unit in pending:
        if background and unit.kind == "checkpoint":
            if uncommitted:
                return False  # sent by its own task, after the driver committed the earlier one
            uncommitted = True
        if sent.get(unit) == incarnation:
            continue
        worker.submit(unit_op(unit, run.run_dir, background=background))
        sent[unit] = incarnation
    return True


def _final_checkpoint(
    run: LiveRun, stop: Unit, pending: deque[Unit], checkpoints: _Checkpoints, background: bool
) -> None:
    """Early stopping fired at `stop`: make the stopped state durable with a checkpoint at that batch."""
    step = run.plan.step_after(stop.through)
    unit = next((u for u in pending if u.kind == "checkpoint" and u.through == stop.through), None)
    target = unit or Unit("checkpoint", stop.through, stop.through, step)
    # the same operation as a pre-sent one (joined, not repeated); committed at once either way
    checkpoints.record(checkpoint(run.run_key, target.through, target.step, background))
    checkpoints.commit()
