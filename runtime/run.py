"""One run's lifecycle below the flows: open it (lease, debris, manifest, run settings, worker, restore) and finish it
(summary, the durable cursor's export record), Prefect-free.

    run = open_run(prepare_run(model, train, valid, config, run_key, storage), RunOptions(cpu_threads=1))
    with run:                                   # failure or not, the lease is released at the end
        if run.done is None:
            run.worker.call(Advance(first=0, through=3))       # the flow drives units through its tasks instead
            summary, _ = finish(run)                           # exports through the worker, commits the cursor
        else:
            summary = run.completed_summary()

What the orchestration layer knows (its flow run id, whether a retry follows a failure, how to ask whether a lease
holder is gone, where to log, what to announce on failure) comes in as ``RunHooks``; this module imports no Prefect.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_gliner2.runtime import faults, handover, live_runs
from prefect_gliner2.runtime.errors import StorageFullError, is_transient, permanent_storage_errno, storage_full_error
from prefect_gliner2.runtime.lease import DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT, HolderGone, RunLease
from prefect_gliner2.runtime.live_runs import LiveRun
from prefect_gliner2.runtime.pause import selection_curve
from prefect_gliner2.runtime.prepare import PreparedRun
from prefect_gliner2.runtime.protocol import Export, ExportResult, Status
from prefect_gliner2.runtime.resources import default_cpu_threads, disk_used
from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.errors import CheckpointDamagedError, ConfigError
from prefect_gliner2.session_core.run_warnings import run_warnings
from prefect_gliner2.session_core.storage import absolute_uri, resolve

__all__ = [
    "DEFAULT_KEEP_CHECKPOINTS",
    "PER_ATTEMPT",
    "OpenRun",
    "RunHooks",
    "RunOptions",
    "finish",
    "open_run",
    "recover_run_directory",
]

DEFAULT_KEEP_CHECKPOINTS = 3
# summary keys that describe one attempt, not the run: kept out of the durable cursor's summary
PER_ATTEMPT = ("units_run", "worker_starts", "flow_run_id", "disk_bytes", "checkpoint_bytes", "checkpoints_kept")

if TYPE_CHECKING:
    Logger = logging.Logger | logging.LoggerAdapter[Any]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How a run is opened; none of these change the plan."""

    export_to: str | None = None  # default: the run directory's export/ folder
    init_weights: str | None = None  # a new run starts from these weights (recorded: a resume passes the same)
    device: str | None = None  # "cpu", "cuda", "cuda:N"; None: CUDA when available
    cpu_threads: int | None = None  # None: recorded with the run, else this worker slot's share
    keep_checkpoints: int | None = DEFAULT_KEEP_CHECKPOINTS  # None keeps every checkpoint
    lease_ttl: float = DEFAULT_LEASE_TTL
    lease_wait: float = DEFAULT_LEASE_WAIT


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RunHooks:
    """What the layer above tells the lifecycle (the flow passes Prefect's answers; the defaults suit a plain
    process): its flow run id, whether a retry follows a failure (then the live worker is kept for it), who can
    prove a lease holder gone, where to log, and what to do when an opened run fails."""

    flow_run_id: str | None = None
    retry_follows: Callable[[], bool] = _never
    holder_gone: HolderGone | None = None
    on_failed: Callable[[RunDirectory, BaseException], None] | None = None
    logger: Logger = field(default=logger)


@dataclass
class OpenRun:
    """A run whose lease this process holds, with its worker registered in ``live_runs`` (see ``open_run``)."""

    prepared: PreparedRun
    options: RunOptions
    hooks: RunHooks
    lease: RunLease
    previous: str | None  # the flow run that held the run key before (None: none recorded)
    export_uri: str = ""  # where the selected model is exported (absolute)
    live: LiveRun | None = None
    done: dict[str, Any] | None = None  # the recorded summary when the run already finished and exported here
    cursor: DurableCursor | None = None  # where training continues (None: from the start)

    @property
    def run_dir(self) -> RunDirectory:
        return self.prepared.run_dir

    @property
    def run_key(self) -> str:
        return self.prepared.run_dir.run_key

    @property
    def worker(self) -> SessionWorker:
        assert self.live is not None, "the run is open"
        return self.live.worker

    @property
    def start(self) -> int:
        """The first batch still to train."""
        return self.cursor.cursor if self.cursor is not None else 0

    def completed_summary(self) -> dict[str, Any]:
        """The summary of an attempt that found the run already finished (nothing trained)."""
        assert self.done is not None, "the run is complete"
        attempt = {"units_run": 0, "worker_starts": 0, "flow_run_id": self.hooks.flow_run_id}
        return {**self.done, **attempt, **disk_used(self.run_dir)}

    def close(self) -> None:
        """The run ended well: stop its worker (or hand it over, ``runtime.handover``) and release the lease."""
        try:
            live = live_runs.lookup(self.run_key)
            kept = live is not None and handover.deposit(self.run_key, live.worker)
            live_runs.unregister(self.run_key, close=not kept)
        finally:
            self.lease.release()

    def fail(self, exc: BaseException) -> BaseException:
        """The run failed with `exc`: keep the worker only for a retry that follows a transient error, announce the
        failure otherwise, release the lease. Returns the error to raise (a permanent storage errno becomes a
        StorageFullError that says what to free)."""
        try:
            if not (is_transient(exc) and self.hooks.retry_follows()):
                live_runs.unregister(self.run_key)
                if self.hooks.on_failed is not None:
                    self.hooks.on_failed(self.run_dir, exc)
            code = permanent_storage_errno(exc)
            if code is not None and not isinstance(exc, StorageFullError):
                return storage_full_error(code, f"{type(exc).__name__}: {exc}")
            return exc
        finally:
            self.lease.release()

    def __enter__(self) -> OpenRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> None:
        if exc is None:
            self.close()
            return
        error = self.fail(exc)
        if error is not exc:
            raise error from exc


def open_run(prepared: PreparedRun, options: RunOptions | None = None, hooks: RunHooks | None = None) -> OpenRun:
    """Take the run key's lease and open the run in it: remove a killed run's debris, write (or check) the manifest
    and the run settings, and start the session worker (or reuse the live one of this flow run's previous attempt),
    which restores the durable cursor's checkpoint, falling back to the previous intact one when it is damaged. A
    run that already finished and exported to the same place opens with ``done`` set and no worker started.
    When opening fails, ``OpenRun.fail`` runs (the lease is released) and its error is raised."""
    options, hooks = options or RunOptions(), hooks or RunHooks()
    if options.init_weights is not None:
        _check_init_weights(options.init_weights)
    run_dir = prepared.run_dir
    run_dir.create()
    lease = RunLease(
        run_dir,
        flow_run_id=hooks.flow_run_id,
        ttl=options.lease_ttl,
        wait=options.lease_wait,
        holder_gone=hooks.holder_gone,
    )
    previous = (lease.last_holder() or {}).get("flow_run_id")
    lease.acquire()
    for reason in lease.took_over:
        hooks.logger.warning("took over the lease of run key %s from %s", run_dir.run_key, reason)
    run = OpenRun(prepared, options, hooks, lease, previous)
    try:
        run.export_uri = absolute_uri(options.export_to) if options.export_to else run_dir.default_export_uri
        _open(run)
    except BaseException as exc:
        error = run.fail(exc)
        if error is exc:
            raise
        raise error from exc
    return run


def _open(run: OpenRun) -> None:
    """Inside the lease: completion, debris, manifest, run settings, the worker, and the hardware check."""
    prepared, run_dir, log = run.prepared, run.run_dir, run.hooks.logger
    run.done = completed(run_dir, run.export_uri)
    existing = live_runs.lookup(run_dir.run_key)
    if existing is not None:
        existing.worker.settle()  # a background checkpoint write of a previous attempt's worker is not debris
    recover_run_directory(run_dir, prepared.plan.epoch, run.export_uri, prepared.manifest, log)
    run.live = _live_run(run, existing, prewarm=run.done is None)
    plan = prepared.plan
    log.info(
        "run %s at %s: %d batches, %d updates, plan %s",
        run_dir.run_key,
        run_dir.uri,
        plan.batch_count,
        plan.max_steps,
        plan.fingerprint[:12],
    )
    if run.done is None:
        _check_hardware(run.live, bool(plan.config.bf16), run.options.device)
        run.cursor = run_dir.read_cursor()


def recover_run_directory(
    run_dir: RunDirectory,
    epoch_of: Callable[[int], int],
    export_uri: str | None = None,
    manifest: bytes | None = None,
    log: Logger = logger,
) -> str | None:
    """Inside the lease, before a worker starts: remove a killed run's debris (next to a local `export_uri` too),
    write the `manifest` of a new run (or check it against the recorded one), and check the checkpoint the durable
    cursor names by its index alone (no payload is read), moving a damaged one aside and rewinding the cursor.
    Returns the name of the checkpoint moved aside, if any."""
    removed = run_dir.remove_debris(export_uri)
    if removed:
        log.info("removed debris of an interrupted run: %s", ", ".join(removed))
    if manifest is not None and run_dir.ensure_manifest(manifest):
        log.info("new run %s: manifest written to %s", run_dir.run_key, run_dir.manifest_uri)
    damaged = run_dir.recover_damaged_restore_point(epoch_of)
    if damaged:
        _log_damaged(run_dir, damaged, log)
    return damaged


def _live_run(run: OpenRun, existing: LiveRun | None, *, prewarm: bool) -> LiveRun:
    """Record the run settings, then reuse this flow run's live worker when it matches, else start a new one."""
    prepared, run_dir, options = run.prepared, run.run_dir, run.options
    recorded = run_dir.read_run_info() or {}
    threads = options.cpu_threads or recorded.get("cpu_threads") or default_cpu_threads()
    settings = {"model": prepared.model, "device": options.device or "auto", "cpu_threads": threads}
    run_dir.ensure_run_info({**settings, "init_weights": options.init_weights})
    spec = WorkerSpec(
        model=prepared.model,
        manifest_uri=run_dir.manifest_uri,
        cpu_threads=threads,
        device=options.device,
        init_weights=options.init_weights,
        faults=faults.installed(),  # None unless test code installed a fault plan in this process
    )
    if (
        existing is not None
        and existing.flow_run_id == run.hooks.flow_run_id
        and existing.worker.alive
        and existing.worker.spec == spec
        and existing.content_address == prepared.content_address
    ):
        worker = existing.worker
        run.hooks.logger.info("reusing the live session worker (pid %s) of the previous attempt", worker.pid)
    else:
        live_runs.unregister(run_dir.run_key)
        worker = SessionWorker(spec, restore_locator=run_dir.newest_checkpoint_uri, name=f"gliner2-{run_dir.run_key}")
        if prewarm:
            worker.start()  # the child imports torch and restores while the caller sets up
            if run_dir.read_cursor() is not None:
                _restored_or_fallen_back(worker, run_dir, prepared.plan.epoch, run.hooks.logger)
    live = LiveRun(
        run_dir.run_key,
        run_dir,
        prepared.plan.fingerprint,
        prepared.content_address,
        worker,
        run.lease,
        run.hooks.flow_run_id,
        prepared.plan,
        options.keep_checkpoints,
    )
    live_runs.register(live)
    return live


def _restored_or_fallen_back(worker: SessionWorker, run_dir: RunDirectory, epoch_of: Any, log: Logger) -> None:
    """Wait for the worker's restore, the only full (verified) read of the checkpoint. When it finds the checkpoint
    damaged, move it aside, rewind the cursor to the previous intact one and restore that instead (CheckpointError
    when no earlier checkpoint is intact)."""
    while True:
        worker.start()
        try:
            status = worker.call(Status())
        except CheckpointDamagedError as exc:
            damaged = run_dir.fall_back_from(worker.restored_from or "", exc, epoch_of)
            _log_damaged(run_dir, damaged, log)
            continue
        log.info(
            "session worker (pid %s) restored %s; its start, seconds after its entry point: %s",
            status.pid,
            status.restored_from,
            status.start_text(),
        )
        return


def _log_damaged(run_dir: RunDirectory, damaged: str, log: Logger) -> None:
    restore = run_dir.read_cursor()
    log.warning(
        "checkpoint %s is damaged: moved aside as %s%s-*; continuing from the previous intact checkpoint %s (batch %s)",
        damaged,
        layout.DAMAGED_PREFIX,
        damaged,
        restore.checkpoint if restore else None,
        restore.cursor if restore else None,
    )


def _check_hardware(live: LiveRun, bf16: bool, device: str | None) -> None:
    """bf16 or an explicit CUDA device: wait for the worker's session so a hardware refusal fails the run now."""
    if bf16 or (device or "").startswith("cuda"):
        live.worker.call(Status())


def _check_init_weights(uri: str) -> None:
    fs, path = resolve(uri)
    if not fs.isdir(path):
        raise ConfigError(
            f"init_weights {uri!r} is not a directory; pass a model, adapter, export or checkpoint directory"
        )


def completed(run_dir: RunDirectory, export_uri: str) -> dict[str, Any] | None:
    """The recorded summary when this run already finished and exported to `export_uri`, else None."""
    cursor = run_dir.read_cursor()
    if cursor is None or not cursor.finished or cursor.export != export_uri or cursor.summary is None:
        return None
    fs, path = resolve(export_uri)
    return dict(cursor.summary) if fs.exists(f"{path}/{layout.EXPORT_MARKER_FILE}") else None


def finish(
    run: OpenRun, export: ExportResult | None = None, *, units_run: int = 0
) -> tuple[dict[str, Any], DurableCursor | None]:
    """The run's summary once its model is exported, and the durable cursor it ends on. `export` is the export the
    caller made (the flow's export task); None exports the selected (best, else final) model here, through the
    worker. When the plan is finished, the cursor records the export and the summary, so that a later attempt finds
    the run complete (``OpenRun.done``)."""
    if export is None:
        run.lease.check()  # a run that lost its run key publishes nothing
        run.worker.start()
        export = run.worker.call(Export(uri=run.export_uri, which="best"))
    final = run.run_dir.read_cursor()
    summary = _summary(run, export, final, units_run)
    if final is not None and final.finished:
        durable = {k: v for k, v in summary.items() if k not in PER_ATTEMPT}
        run.run_dir.commit_cursor(dataclasses.replace(final, export=run.export_uri, summary=durable))
    summary.update(disk_used(run.run_dir))
    return summary, final


def _summary(run: OpenRun, info: ExportResult, cursor: DurableCursor | None, units_run: int) -> dict[str, Any]:
    live = run.live
    assert live is not None, "the run is open"
    native = info.summary
    best = native.best_metric
    return {
        "run_key": live.run_key,
        "run_dir": live.run_dir.uri,
        "export": info.uri,
        "label": info.label,
        "export_step": info.step,
        "thresholds": info.thresholds,
        "checkpoint": cursor.checkpoint if cursor is not None else None,
        "checkpoints": live.run_dir.checkpoints_uri,
        "total_steps": native.total_steps,
        "total_epochs": native.total_epochs,
        "best_metric": best if isinstance(best, (int, float)) and abs(best) != float("inf") else None,
        "best_step": native.best_step,
        "metric_for_best": live.plan.config.metric_for_best,
        "validations": selection_curve(native.eval_metrics_history, str(live.plan.config.metric_for_best)),
        "stopped_early": bool(native.stopped_early),
        "batch_count": live.plan.batch_count,
        "resumed_from_batch": run.start,
        "units_run": units_run,
        "worker_starts": live.worker.starts,
        "fingerprint": live.fingerprint,
        "content_address": live.content_address,
        "flow_run_id": live.flow_run_id,
        "warnings": list(
            run_warnings(
                native.eval_metrics_history,
                architecture=live.plan.architecture,
                threshold=float(live.plan.config.eval_threshold),
                thresholds=info.thresholds,
            ).values()
        ),
    }
