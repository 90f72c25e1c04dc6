"""Pausing a run at a validation point: where it pauses, the pause record its durable cursor keeps, and how a caller
outside the run reads whether it is paused or finished.

    pause_index(plan, start=0, pause_at_step=40)   # the batch after whose validation the run pauses (or None)
    run_outcome(RunDirectory(storage, run_key))     # ("paused", record) / ("finished", summary) / None

A run given ``pause_at_step=S`` trains to its first validation at or after S optimizer updates, checkpoints there
(the checkpoint is committed: the durable cursor names it) and stops; the cursor then carries the pause record (the
run key, the position, the selection metric's value at every validation so far). Nothing of the plan changes, so
the same run key continues exactly from that checkpoint: with a larger ``pause_at_step``, or none to finish.
Torch-free and Prefect-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory

__all__ = ["PAUSED", "pause_index", "pause_record", "record_pause", "run_outcome", "selection_curve"]

PAUSED = "paused"  # the pause record's marker key (True) in the durable cursor's summary


def pause_index(plan: Any, start: int, pause_at_step: int) -> int | None:
    """The first validation batch at or after batch `start` after which `pause_at_step` updates are done; None when
    the plan validates no more before its last batch (the run then goes to its end: pausing there saves nothing)."""
    last = plan.batch_count - 1
    for index in plan.validations():
        if index >= start and plan.step_after(index) >= pause_at_step:
            return index if index < last else None
    return None


def selection_curve(history: Iterable[Mapping[str, Any]], metric: str) -> list[dict[str, Any]]:
    """The selection metric at every validation: ``[{"step": S, "value": V}, ...]`` (the validations' order)."""
    return [{"step": int(entry["step"]), "value": _number(entry.get(metric))} for entry in history]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def pause_record(
    run_dir: RunDirectory,
    plan: Any,
    cursor: DurableCursor,
    history: Iterable[Mapping[str, Any]],
    *,
    pause_at_step: int,
    best_metric: float | None,
    best_step: int | None,
) -> dict[str, Any]:
    """What a paused run reports (and its cursor keeps): where it stopped and its selection metric so far."""
    config = plan.config
    metric = str(config.metric_for_best)
    best = best_metric if isinstance(best_metric, (int, float)) and not math.isinf(best_metric) else None
    return {
        PAUSED: True,
        "run_key": run_dir.run_key,
        "run_dir": run_dir.uri,
        "pause_at_step": pause_at_step,
        "checkpoint": cursor.checkpoint,
        "cursor": cursor.cursor,
        "total_steps": cursor.step,
        "max_steps": plan.max_steps,
        "metric_for_best": metric,
        "greater_is_better": bool(config.greater_is_better),
        "best_metric": best,
        "best_step": best_step,
        "validations": selection_curve(history, metric),
        "fingerprint": plan.fingerprint,
    }


def record_pause(run_dir: RunDirectory, record: dict[str, Any]) -> None:
    """Keep `record` in the durable cursor, which must name the pause's checkpoint (under the run key's lease)."""
    cursor = run_dir.read_cursor()
    if cursor is None or cursor.checkpoint != record["checkpoint"] or cursor.finished:
        where = cursor.checkpoint if cursor is not None else None
        raise RuntimeError(f"the durable cursor of run {run_dir.run_key} is at {where}, not at the pause's checkpoint")
    if cursor.summary != record:
        run_dir.commit_cursor(dataclasses.replace(cursor, summary=record))


def run_outcome(run_dir: RunDirectory) -> tuple[str, dict[str, Any]] | None:
    """Where a run stands for a caller that waited for its flow run: ("finished", the durable summary),
    ("paused", the pause record), or None (no pause or finish recorded: it has not ended that way)."""
    cursor = run_dir.read_cursor()
    if cursor is None or cursor.summary is None:
        return None
    if cursor.finished:
        return ("finished", dict(cursor.summary))
    if cursor.summary.get(PAUSED):
        return (PAUSED, dict(cursor.summary))
    return None
