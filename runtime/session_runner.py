"""The operations a session worker executes, in order, over one ManagedTraining (``SessionRunner``, ``HANDLERS``).

Requests and results are the dataclasses of ``prefect_gliner2.runtime.protocol``; ``HANDLERS`` maps each request
type to the ``SessionRunner`` method that executes it. Every operation names a *position* in the plan and is
idempotent: ``Advance(first, through)`` trains (and runs due validations) until the cursor is past ``through``,
replaying from a restored cursor when behind and only reporting recorded history when already past; ``Validate``,
``Checkpoint`` and ``Export`` first advance to their position. So a skipped (cached) or repeated operation can
never leave the session behind the plan.

Background checkpoints (``Checkpoint(..., background=True)``): the worker snapshots the state at the checkpoint's
position (detached host copies), starts one writer thread and answers ``pending`` at once, so the next operations
train while the files are written. It never holds more than one snapshot: a second background checkpoint, an
export and "close" first wait for the pending write. ``CommitCheckpoint`` waits for it and reports it committed
(the flow moves the durable cursor only then). A failed background write is raised by the next operation, whatever
it is (the worker then exits like after any error, and the flow restarts it from the durable cursor).

Test fault injection reaches the worker only as ``WorkerSpec.faults`` (None in production); checkpoint and export
writes run its ``checkpoint-write`` / ``export-write`` points through their ``before_commit`` callback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prefect_gliner2.runtime.background import BackgroundWrite
from prefect_gliner2.runtime.faults import FaultPlan
from prefect_gliner2.runtime.protocol import (
    Advance,
    AdvanceResult,
    Checkpoint,
    CheckpointResult,
    CommitCheckpoint,
    Export,
    ExportResult,
    Result,
    Score,
    ScoreResult,
    Status,
    StatusResult,
    Summary,
    SummaryResult,
    Validate,
    ValidateResult,
    WorkerSpec,
)
from prefect_gliner2.runtime.worker_setup import build_training
from prefect_gliner2.session_core import layout, storage

if TYPE_CHECKING:
    from prefect_gliner2.training.native_save import SameBytes

__all__ = ["HANDLERS", "SessionRunner", "StartClock"]

_WRITTEN_KEPT = 64  # background writes remembered for CommitCheckpoint (operations sent ahead are at most 64)


class StartClock:
    """A worker's start, phase by phase: (phase, seconds after its entry point), for ``StatusResult.start``."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.phases: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        self.phases.append((phase, round(time.monotonic() - self.began, 3)))


class SessionRunner:
    """The operations a worker executes, over one ManagedTraining."""

    def __init__(
        self, spec: WorkerSpec, restore_uri: str | None, *, head_started: bool = False, start: StartClock | None = None
    ) -> None:
        import torch

        self.faults = spec.faults or FaultPlan()
        self.start = start or StartClock()
        if restore_uri and not head_started:
            self.start.mark("prefetch")
        self.plan, self.run = build_training(spec, restore_uri, head_started=head_started)
        self.start.mark("ready")
        self.restored_from = restore_uri
        self.threads = torch.get_num_threads()
        self._writer: BackgroundWrite | None = None  # the one background checkpoint write in flight
        self._written: dict[str, CheckpointResult] = {}  # background writes that ended, newest last (bounded)
        self._last_committed: tuple[str, int] | None = None  # (uri, step) of the newest checkpoint committed here
        self.trained_batches = 0  # batches trained by this worker, and the seconds they took (no validation)
        self.trained_seconds = 0.0

    # ---- positions -----------------------------------------------------------------------------------------

    def _advance(self, through: int, first: int | None = None) -> int:
        """Train (and validate when due) until the cursor is past `through`; returns batches replayed before `first`."""
        run, replayed = self.run, 0
        while not run.finished and run.cursor <= through:
            if run.validation_due:
                self._validate()
                continue
            index = run.cursor
            self.faults.hit("batch", index)
            started = time.perf_counter()
            run.train_batch()
            self.trained_seconds += time.perf_counter() - started
            self.trained_batches += 1
            if first is not None and index < first:
                replayed += 1
        return replayed

    def _validate(self) -> dict[str, Any]:
        self.faults.hit("validate", self.run.cursor - 1)
        return self.run.validate()

    # ---- operations ----------------------------------------------------------------------------------------

    def execute(self, request: Any) -> Result:
        """Run one request through the handler its type maps to in HANDLERS."""
        handler = HANDLERS.get(type(request))
        if handler is None:
            raise TypeError(
                f"the session worker has no operation for {type(request).__name__}; send a runtime.protocol request"
            )
        writer = self._writer
        if writer is not None and writer.done() and writer.error is not None:
            written = self._written.get(request.uri) if isinstance(request, CommitCheckpoint) else None
            if written is not None:
                return written  # durable before the write that failed: committed first (the flow sent it ahead)
            self._settle()  # raises the failed background write before anything else happens
        return handler(self, request)

    def status(self, request: Status) -> StatusResult:
        run = self.run
        return StatusResult(
            pid=os.getpid(),
            cursor=run.cursor,
            step=run.session.step,
            finished=run.finished,
            validation_due=run.validation_due,
            stopped_early=run.stopped_early,
            restored_from=self.restored_from,
            cpu_threads=self.threads,
            device=str(run.session.device),
            batch_count=self.plan.batch_count,
            pending_checkpoint=self._writer.uri if self._writer is not None and not self._writer.done() else None,
            start=tuple(self.start.phases),
        )

    def advance(self, request: Advance) -> AdvanceResult:
        first, through = request.first, request.through
        batches, seconds = self.trained_batches, self.trained_seconds
        replayed = self._advance(through, first)
        run = self.run
        last = min(through, self.plan.batch_count - 1)
        return AdvanceResult(
            first=first,
            through=through,
            cursor=run.cursor,
            step=run.session.step,
            epoch=self.plan.epoch(last),
            replayed=replayed,
            stopped_early=run.stopped_early,
            updates=tuple(h for h in run.train_metrics_history if first <= h["batch"] <= through),
            trained=self.trained_batches - batches,
            seconds=self.trained_seconds - seconds,
        )

    def validate(self, request: Validate) -> ValidateResult:
        run, index = self.run, request.index
        self._advance(index)
        if run.validation_due and run.cursor == index + 1:
            metrics: dict[str, Any] | None = self._validate()
        else:
            metrics = next((h for h in run.eval_metrics_history if h["batch"] == index), None)
        return ValidateResult(
            index=index,
            metrics=metrics,
            best_metric=run.best_metric,
            best_step=run.best_step,
            stopped_early=run.stopped_early,
            step=run.session.step,
            history=tuple(run.eval_metrics_history),
        )

    def checkpoint(self, request: Checkpoint) -> CheckpointResult:
        run, index, uri = self.run, request.index, request.uri
        self._settle()  # never more than one snapshot: the previous background write ends first
        self._advance(index)
        if run.validation_due and run.cursor == index + 1:
            self._validate()
        info = CheckpointResult(
            uri=uri,
            index=index,
            cursor=run.cursor,
            step=run.session.step,
            epoch=self.plan.epoch(index),
            finished=run.finished,
            stopped_early=run.stopped_early,
            best_metric=run.best_metric,
            best_step=run.best_step,
            committed=False,
        )
        if run.cursor != index + 1:
            if uri in self._written:  # written in the background by this worker, not committed by the flow yet
                return self._written[uri]
            reason = f"the session is at cursor {run.cursor}, past batch {index}; nothing to write there"
            return dataclasses.replace(info, reason=reason)
        existing = _committed_meta(uri)
        if existing is not None:
            if existing.get("plan_fingerprint") != self.plan.fingerprint or existing.get("cursor") != run.cursor:
                raise _checkpoint_conflict(uri, existing, run.cursor)
            self._last_committed = (uri, run.session.step)
            return dataclasses.replace(info, committed=True, existing=True)
        storage.remove_uncommitted(uri)  # debris of an interrupted write (we hold the lease)
        self.faults.hit("checkpoint", index)
        if request.background:
            prepared = run.prepare_checkpoint(uri)
            self._writer = BackgroundWrite(info, lambda: self._write(prepared, index))
            return dataclasses.replace(info, pending=True)
        with self._uploads("checkpoint-write", index):
            digest = run.save_state(uri, before_commit=self._point("checkpoint-write", index))
        self._last_committed = (uri, run.session.step)
        return dataclasses.replace(info, committed=True, existing=False, index_sha256=digest)

    def commit_checkpoint(self, request: CommitCheckpoint) -> CheckpointResult:
        """The background write of `request.uri`, once durable (waiting for it; its error is raised). Without one
        in this worker (a restarted worker): the checkpoint as a synchronous ``Checkpoint`` would report it."""
        writer = self._writer
        if writer is not None and writer.uri == request.uri:
            self._settle()
        written = self._written.get(request.uri)
        if written is not None:
            return written
        return self.checkpoint(Checkpoint(index=request.index, uri=request.uri))

    def _write(self, prepared: Any, index: int) -> str:
        """The writer thread's work: the prepared checkpoint's files, then its index (the commit)."""
        with self._uploads("checkpoint-write", index):
            digest: str = self.run.write_prepared(prepared, before_commit=self._point("checkpoint-write", index))
        return digest

    def _settle(self) -> None:
        """Wait for the background write in flight, if any; raise its error, else record it as written."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        digest = writer.wait()
        written = dataclasses.replace(writer.info, committed=True, existing=False, index_sha256=digest)
        self._written[writer.uri] = written
        self._last_committed = (writer.uri, written.step)
        while len(self._written) > _WRITTEN_KEPT:
            del self._written[next(iter(self._written))]

    def export(self, request: Export) -> ExportResult:
        run, uri = self.run, request.uri
        self._settle()
        self._advance(self.plan.batch_count - 1)
        if run.validation_due:
            self._validate()
        label = "best" if request.which == "best" and run.best_state is not None else "final"
        existing = _existing_export(uri)
        if existing is not None:
            step = run.best_step if label == "best" else run.session.step
            if existing.get("label") != label or existing.get("step") != step:
                from prefect_gliner2.session_core.errors import WeightsError

                raise WeightsError(
                    f"export destination {uri} already holds a different model ({existing.get('label')} "
                    f"at step {existing.get('step')}); choose a new export location"
                )
            record = existing
        else:
            before_commit = self._point("export-write", self.plan.batch_count - 1)
            same = self._checkpoint_weights(run.best_step if label == "best" else run.session.step)
            with self._uploads("export-write", self.plan.batch_count - 1):
                record = run.export_weights(uri, which=request.which, before_commit=before_commit, same_bytes=same)
        return ExportResult.from_record(record, uri, label, self.summary(Summary()))

    def _checkpoint_weights(self, step: int | None) -> SameBytes | None:
        """The weights file of the newest checkpoint committed by this worker, when it was taken at `step` and is
        local: an export of the same weights links it instead of writing them again (``native_save``, which
        compares the bytes first)."""
        from prefect_gliner2.training.native_save import checkpoint_weights_file  # torch: the worker's import

        committed = self._last_committed
        if committed is None or step is None or committed[1] != step:
            return None
        return checkpoint_weights_file(committed[0])

    def summary(self, request: Summary) -> SummaryResult:
        """The native summary; the per-step training history only when asked (validation history is small: kept)."""
        return SummaryResult.from_native(self.run.result(), train_history=request.train_history)

    def score(self, request: Score) -> ScoreResult:
        """Score models for promotion here, once the run is finished: its session (and every write) is released
        first, then ``score_sessions_here`` builds its own sessions, as a fresh process would (the retraining flow's
        comparison in the worker that trained the candidate, instead of one more process importing torch)."""
        from prefect_gliner2.runtime.compare import score_sessions_here
        from prefect_gliner2.session_core.errors import SessionStateError

        if not self.run.finished:
            raise SessionStateError(f"scoring asked of a session worker whose run is at batch {self.run.cursor}")
        self.close()
        scores = score_sessions_here(
            request.models, request.base_model, request.data, request.config, request.cpu_threads, request.device
        )
        return ScoreResult(scores)

    def _point(self, point: str, index: int) -> Callable[[], None]:
        return lambda: self.faults.hit(point, index)

    @contextmanager
    def _uploads(self, point: str, index: int) -> Iterator[None]:
        """With a fault plan that names `point`, reach it after each object uploaded to object storage too (a kill
        mid-upload); without one (production), nothing is installed."""
        if not (self.faults.faults or self.faults.markers):
            yield
            return
        storage.set_upload_hook(lambda what: self.faults.hit(point, index))
        try:
            yield
        finally:
            storage.set_upload_hook(None)

    def close(self) -> None:
        try:
            self._settle()
        except Exception:  # noqa: BLE001 - closing: the write is lost, the durable cursor never named it
            logging.getLogger(__name__).exception("background checkpoint write failed before close")
        self.run.close()


#: Which SessionRunner method executes each request type.
HANDLERS: dict[type, Callable[[SessionRunner, Any], Result]] = {
    Status: SessionRunner.status,
    Advance: SessionRunner.advance,
    Validate: SessionRunner.validate,
    Checkpoint: SessionRunner.checkpoint,
    CommitCheckpoint: SessionRunner.commit_checkpoint,
    Export: SessionRunner.export,
    Summary: SessionRunner.summary,
    Score: SessionRunner.score,
}


def _committed_meta(uri: str) -> dict[str, Any] | None:
    fs, path = storage.resolve(uri)
    index = f"{path}/{layout.CHECKPOINT_INDEX_FILE}"
    if not fs.exists(index):
        return None
    meta = json.loads(fs.cat_file(index)).get("meta", {})
    return meta if isinstance(meta, dict) else {}


def _existing_export(uri: str) -> dict[str, Any] | None:
    fs, path = storage.resolve(uri)
    marker = f"{path}/{layout.EXPORT_MARKER_FILE}"
    return json.loads(fs.cat_file(marker)) if fs.exists(marker) else None


def _checkpoint_conflict(uri: str, meta: dict[str, Any], cursor: int) -> Exception:
    from prefect_gliner2.session_core.errors import CheckpointError

    return CheckpointError(
        f"{uri} already holds a checkpoint of plan {str(meta.get('plan_fingerprint'))[:12]} at cursor "
        f"{meta.get('cursor')}, but this run would write cursor {cursor}; the run directory was modified by hand "
        "or shared between runs: start a new run key"
    )
