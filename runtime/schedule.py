"""The flow's unit schedule: which Prefect task runs next, derived from the plan and the durable cursor.

A unit is one task run: ``advance`` (train batches first..through), ``validate`` (the validation after batch i)
or ``checkpoint`` (a managed checkpoint after batch i). Units never straddle a validation or checkpoint point, so
every checkpoint lands exactly where the schedule says and always after the validation at the same batch:

    advance 40-46 | advance 47-47 | validate 47 | checkpoint 47 | advance 48-55 ...

Checkpoints fall at every epoch end (the plan's last batch ends an epoch, so the last unit is always a checkpoint)
and after optimizer updates by their *cadence* (``CheckpointCadence``): a pinned ``checkpoint_every`` N checkpoints
after every N-th update (0: epoch ends only); the automatic cadence (the default) checkpoints at multiples of
``AUTO_CHECKPOINT_UPDATES`` updates, skipping those that come less than ``MIN_CHECKPOINT_SECONDS`` of measured
training after the previous checkpoint: with steps of 0.3 s and more that is every 100 updates, with 20 ms steps
every 1,500. A kill loses at most about that much training; a checkpoint every two seconds would cost Prefect
task runs, API calls and disk churn for nothing. Checkpoints never change what is trained, so where they fall
(which may differ between attempts, as the measured step time does) never changes a bit of the result.

How many batches an ``advance`` unit trains is its *grain* (``TaskGrain``): pinned by the user, or automatic. The
automatic grain starts at one batch and grows as the worker reports how long batches take, so that a task lasts
about ``TARGET_TASK_SECONDS`` and Prefect's cost per task run (a few ms in the flow, ~20 ms of server CPU on
SQLite) is noise beside it. Measured with ``bench/flow.py``'s orchestration figure (the flow process's and the
server's CPU between the first and last batch, over the worker's): at ~10 ms steps, tasks of about 2 s cost 2.1%
(1.95-2.29) of the training's CPU and tasks of about 6 s 1.0% (0.83-1.14), most of it the server's per-task work;
5 s keeps the progress a person watches moving every few seconds. It never changes what is trained: units are
positions, the worker trains the same batches in the same order whatever the grouping, and validation and
checkpoint points always end a unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prefect_gliner2.runtime.protocol import Advance, Checkpoint, Request, Validate
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.layout import checkpoint_name

__all__ = [
    "AUTO",
    "AUTO_CHECKPOINT_UPDATES",
    "AUTO_PIPELINE_DEPTH",
    "CheckpointCadence",
    "MIN_CHECKPOINT_SECONDS",
    "MAX_BATCHES_PER_TASK",
    "TARGET_TASK_SECONDS",
    "TaskGrain",
    "Unit",
    "is_checkpoint_point",
    "pipeline_depth",
    "unit_op",
    "units",
]

AUTO: Literal["auto"] = "auto"
#: The duration an automatic grain aims each training task at (seconds of the worker's training).
TARGET_TASK_SECONDS = 5.0
#: The most an automatic grain grows at once (x4 per measured task: 1, 4, 16, ... batches).
GROWTH = 4
#: The largest automatic grain.
MAX_BATCHES_PER_TASK = 4096
#: The automatic checkpoint cadence checkpoints at multiples of this many optimizer updates...
AUTO_CHECKPOINT_UPDATES = 100
#: ...at least this many seconds of measured training apart (epoch ends always checkpoint).
MIN_CHECKPOINT_SECONDS = 30.0
#: The pipeline depth "auto" stands for: the next two units are with the worker while a task is recorded.
AUTO_PIPELINE_DEPTH = 2


class TaskGrain:
    """How many batches the next ``advance`` unit trains: `pinned`, or automatic (None; see the module docstring).

    ``observe(batches, seconds)`` takes what the worker reported for a unit; the automatic grain becomes the number
    of batches that fill ``target_seconds`` at the measured time per batch (the mean of the newest unit's and the
    previous estimate), growing at most ``GROWTH``-fold per unit and shrinking at once when batches get slower."""

    def __init__(
        self,
        pinned: int | None = None,
        *,
        target_seconds: float = TARGET_TASK_SECONDS,
        maximum: int = MAX_BATCHES_PER_TASK,
    ) -> None:
        if pinned is not None and (isinstance(pinned, bool) or not isinstance(pinned, int) or pinned < 1):
            raise ValueError(f"batches per task must be a positive int or {AUTO!r}, got {pinned!r}")
        self.pinned, self.target_seconds, self.maximum = pinned, target_seconds, maximum
        self._size = pinned or 1
        self._per_batch: float | None = None

    @classmethod
    def of(cls, setting: int | Literal["auto"]) -> TaskGrain:
        """The grain of a ``batches_per_task`` setting: a positive int, or "auto"."""
        return cls(None if setting == AUTO else setting)  # type: ignore[arg-type]

    @property
    def batches(self) -> int:
        return self._size

    @property
    def per_batch_seconds(self) -> float | None:
        """The measured seconds per batch (None before the first measured unit)."""
        return self._per_batch

    def observe(self, batches: int, seconds: float) -> None:
        if self.pinned is not None or batches <= 0 or seconds <= 0:
            return
        per = seconds / batches
        self._per_batch = per if self._per_batch is None else (self._per_batch + per) / 2
        wanted = max(1, math.ceil(self.target_seconds / self._per_batch))
        self._size = min(wanted, self._size * GROWTH, self.maximum)


def pipeline_depth(setting: int | Literal["auto"]) -> int:
    """The pipeline depth of a ``pipeline_depth`` setting: a non-negative int, or "auto" (``AUTO_PIPELINE_DEPTH``)."""
    return AUTO_PIPELINE_DEPTH if setting == AUTO else int(setting)


@dataclass(frozen=True)
class Unit:
    kind: str  # "advance" | "validate" | "checkpoint"
    first: int
    through: int
    step: int = 0  # optimizer steps after `through` (names checkpoints)


def is_checkpoint_point(plan: Any, index: int, checkpoint_every: int) -> bool:
    """Whether a pinned cadence of `checkpoint_every` updates (0: epoch ends only) checkpoints after batch `index`."""
    if plan.is_epoch_end(index):
        return True
    return checkpoint_every > 0 and plan.is_update(index) and plan.step_after(index) % checkpoint_every == 0


class CheckpointCadence:
    """Where checkpoints fall: after every `pinned` updates, or automatic (None; see the module docstring).

    ``due(plan, index, start)`` is asked once per batch from `start`, in order, as units are formed; the automatic
    cadence reads the `grain`'s measured seconds per batch (none measured yet: every ``AUTO_CHECKPOINT_UPDATES``
    updates)."""

    def __init__(
        self,
        pinned: int | None = None,
        *,
        grain: TaskGrain | None = None,
        every: int = AUTO_CHECKPOINT_UPDATES,
        min_seconds: float = MIN_CHECKPOINT_SECONDS,
    ) -> None:
        if pinned is not None and (isinstance(pinned, bool) or not isinstance(pinned, int) or pinned < 0):
            raise ValueError(f"checkpoint_every must be a non-negative int or {AUTO!r}, got {pinned!r}")
        self.pinned, self.grain, self.every, self.min_seconds = pinned, grain, every, min_seconds
        self._last: int | None = None  # the batch of the previous checkpoint (None: the start of this attempt)

    @classmethod
    def of(cls, setting: int | Literal["auto"], grain: TaskGrain | None = None) -> CheckpointCadence:
        """The cadence of a ``checkpoint_every`` setting: a non-negative int, or "auto" (reading `grain`)."""
        return cls(None if setting == AUTO else setting, grain=grain)  # type: ignore[arg-type]

    def due(self, plan: Any, index: int, start: int) -> bool:
        if self.pinned is not None:
            return is_checkpoint_point(plan, index, self.pinned)
        due = plan.is_epoch_end(index) or (
            plan.is_update(index) and plan.step_after(index) % self.every == 0 and self._long_enough(index, start)
        )
        if due:
            self._last = index
        return due

    def _long_enough(self, index: int, start: int) -> bool:
        per_batch = self.grain.per_batch_seconds if self.grain is not None else None
        if per_batch is None:
            return True
        since = index + 1 - (start if self._last is None else self._last + 1)
        return since * per_batch >= self.min_seconds


def units(
    plan: Any,
    start: int,
    *,
    batches_per_task: int | TaskGrain,
    checkpoint_every: int | CheckpointCadence,
    validate: bool,
) -> Iterator[Unit]:
    """The units from batch `start` to the end of the plan, lazily (plans can have millions of batches); a
    `TaskGrain` is read as each unit is formed, so an automatic grain applies to the units formed after it grew (an
    automatic `CheckpointCadence` reads the grain's measurement the same way)."""
    grain = batches_per_task if isinstance(batches_per_task, TaskGrain) else TaskGrain(batches_per_task)
    cadence = checkpoint_every
    if not isinstance(cadence, CheckpointCadence):
        cadence = CheckpointCadence(cadence)
    first = start
    for index in range(start, plan.batch_count):
        validation = validate and plan.is_validation(index)
        checkpoint = cadence.due(plan, index, start)
        if validation or checkpoint or index - first + 1 >= grain.batches or index == plan.batch_count - 1:
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
