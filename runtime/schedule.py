"""The flow's unit schedule: which Prefect task runs next, derived from the plan and the durable cursor.

A unit is one task run: ``advance`` (train batches first..through), ``validate`` (the validation after batch i)
or ``checkpoint`` (a managed checkpoint after batch i). Units never straddle a validation or checkpoint point, so
every checkpoint lands exactly where the schedule says and always after the validation at the same batch:

    advance 40-46 | advance 47-47 | validate 47 | checkpoint 47 | advance 48-55 ...

Checkpoints fall after every ``checkpoint_every``-th optimizer update and at every epoch end (the plan's last batch
ends an epoch, so the last unit is always a checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.runtime.protocol import Advance, Checkpoint, Request, Validate
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.layout import checkpoint_name

__all__ = ["Unit", "is_checkpoint_point", "unit_op", "units"]


@dataclass(frozen=True)
class Unit:
    kind: str  # "advance" | "validate" | "checkpoint"
    first: int
    through: int
    step: int = 0  # optimizer steps after `through` (names checkpoints)


def is_checkpoint_point(plan: Any, index: int, checkpoint_every: int) -> bool:
    if plan.is_epoch_end(index):
        return True
    return checkpoint_every > 0 and plan.is_update(index) and plan.step_after(index) % checkpoint_every == 0


def units(plan: Any, start: int, *, batches_per_task: int, checkpoint_every: int, validate: bool) -> Iterator[Unit]:
    """The units from batch `start` to the end of the plan, lazily (plans can have millions of batches)."""
    first = start
    for index in range(start, plan.batch_count):
        validation = validate and plan.is_validation(index)
        checkpoint = is_checkpoint_point(plan, index, checkpoint_every)
        if validation or checkpoint or index - first + 1 >= batches_per_task or index == plan.batch_count - 1:
            yield Unit("advance", first, index)
            first = index + 1
        if validation:
            yield Unit("validate", index, index)
        if checkpoint:
            yield Unit("checkpoint", index, index, plan.step_after(index))


def unit_op(unit: Unit, run_dir: RunDirectory, *, background: bool = False) -> Request[Any]:
    """The worker request a unit stands for (identical for the task and for pipelined pre-submission); `background`
    makes checkpoint units background checkpoints."""
    if unit.kind == "advance":
        return Advance(first=unit.first, through=unit.through)
    if unit.kind == "validate":
        return Validate(index=unit.through)
    uri = run_dir.checkpoint_uri(checkpoint_name(unit.step, unit.through))
    return Checkpoint(index=unit.through, uri=uri, background=background)
