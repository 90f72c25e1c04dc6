"""Runs a plan's units through the Prefect tasks, strictly in order, optionally pipelined.

Pipelining (``pipeline_depth=d``): before the task of unit k runs, units k..k+d are already sent to the worker, so
the worker computes while Prefect records task runs; each task then joins its pre-sent operation instead of sending
it. The worker executes operations in sending order, so checkpoints still land exactly where the schedule puts
them; after a worker restart, pre-sent operations are sent again, in order, to the new incarnation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.flows.reporting import RunReporter
from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.live_runs import LiveRun
from prefect_gliner2.runtime.protocol import AdvanceResult, CheckpointResult, Request, ValidateResult
from prefect_gliner2.runtime.schedule import Unit, unit_op, units
from prefect_gliner2.tasks.checkpoints import checkpoint
from prefect_gliner2.tasks.training import train_batches
from prefect_gliner2.tasks.validation import validate

__all__ = ["DriveResult", "drive", "run_unit"]


@dataclass
class DriveResult:
    stopped_early: bool = False
    last_checkpoint: CheckpointResult | None = None
    units_run: int = 0


def run_unit(run_key: str, unit: Unit) -> AdvanceResult | ValidateResult | CheckpointResult:
    """Run one unit as its Prefect task (synchronously, in the flow's thread)."""
    if unit.kind == "advance":
        return train_batches(run_key, unit.first, unit.through)
    if unit.kind == "validate":
        return validate(run_key, unit.through)
    return checkpoint(run_key, unit.through, unit.step)


def drive(
    run: LiveRun,
    start: int,
    *,
    batches_per_task: int,
    checkpoint_every: int,
    pipeline_depth: int,
    validate_runs: bool,
    reporter: RunReporter,
    then: Request[Any] | None = None,
) -> DriveResult:
    """Run every unit from batch `start` to the end of the plan (or to early stopping).

    `then` is the worker request that follows the last unit (the export); when pipelining, it is sent ahead too.
    """
    plan = run.plan
    source = units(
        plan, start, batches_per_task=batches_per_task, checkpoint_every=checkpoint_every, validate=validate_runs
    )
    pending: deque[Unit] = deque()
    sent: dict[Unit, str] = {}
    outcome = DriveResult()
    exhausted = False
    while True:
        while not exhausted and len(pending) < pipeline_depth + 1:
            upcoming = next(source, None)
            exhausted = upcoming is None
            if upcoming is not None:
                pending.append(upcoming)
        if not pending:
            return outcome
        if pipeline_depth:
            _presubmit(run, pending, sent)
            if exhausted and then is not None and run.worker.alive:
                run.worker.submit(then)  # joined by the export task (or re-sent by it)
        unit = pending.popleft()
        result = run_unit(run.run_key, unit)
        if sent.pop(unit, None) is not None:
            run.worker.release(unit_op(unit, run.run_dir))  # a cached task never consumed its pre-sent request
        outcome.units_run += 1
        faults.hit("unit", unit.through)
        if isinstance(result, AdvanceResult):
            reporter.progress(result)
        elif isinstance(result, CheckpointResult):
            outcome.last_checkpoint = result
            reporter.checkpoint(result)
        else:
            reporter.validation(result)
            if result.stopped_early:
                outcome.stopped_early = True
                outcome.last_checkpoint = _final_checkpoint(run, unit, pending, reporter)
                return outcome


def _presubmit(run: LiveRun, pending: deque[Unit], sent: dict[Unit, str]) -> None:
    worker = run.worker
    if not worker.alive:
        return  # the next task restarts it (and logs why); pre-sending resumes after that
    incarnation = worker.incarnation
    for unit in pending:
        if incarnation is None or sent.get(unit) == incarnation:
            continue
        worker.submit(unit_op(unit, run.run_dir))
        sent[unit] = incarnation


def _final_checkpoint(run: LiveRun, stop: Unit, pending: deque[Unit], reporter: RunReporter) -> CheckpointResult:
    """Early stopping fired at `stop`: make the stopped state durable with a checkpoint at that batch."""
    step = run.plan.step_after(stop.through)
    unit = next((u for u in pending if u.kind == "checkpoint" and u.through == stop.through), None)
    target = unit or Unit("checkpoint", stop.through, stop.through, step)
    result = checkpoint(run.run_key, target.through, target.step)
    reporter.checkpoint(result)
    return result
