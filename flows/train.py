"""The training flow: one managed GLiNER2 training run = one flow run = one session worker process.

    from prefect_gliner2.flows.train import train_flow

    summary = train_flow(
        model="tiny:span",                      # or a model directory, or a Hugging Face id
        train_data="data/train.jsonl", valid_data="data/valid.jsonl",
        config={"fp16": False, "bf16": False, "num_epochs": 3, "batch_size": 8},
        run_key="ner-2024-06", storage="./runs",
    )
    summary["export"]                           # the selected (best, else final) model directory

Calling it again with the same run key -- or retrying the flow run, also after a crash -- continues exactly from
the durable cursor. Importing this module does not import torch: training happens in the worker process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, cast

from prefect import flow, get_run_logger
from prefect.states import Completed
from pydantic import Field

from prefect_gliner2.flows.driver import DriveResult, drive
from prefect_gliner2.flows.events import emit_failed, emit_run_event, emit_start
from prefect_gliner2.flows.params import TrainingSettings, check_runnable
from prefect_gliner2.flows.reporting import RunReporter
from prefect_gliner2.runtime import faults, live_runs
from prefect_gliner2.runtime.errors import (
    RunConflictError,
    StorageFullError,
    is_transient,
    permanent_storage_errno,
    storage_full_error,
)
from prefect_gliner2.runtime.events import RUN_COMPLETED
from prefect_gliner2.runtime.lease import DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT, RunLease
from prefect_gliner2.runtime.live_runs import LiveRun
from prefect_gliner2.runtime.model_sources import model_architecture
from prefect_gliner2.runtime.protocol import Export, ExportResult, Status
from prefect_gliner2.runtime.resources import default_cpu_threads, disk_used
from prefect_gliner2.runtime.rundir import RunDirectory, validate_run_key
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, layout
from prefect_gliner2.session_core.errors import (
    CheckpointDamagedError,
    ConfigError,
)
from prefect_gliner2.session_core.manifest import encode_manifest, load_manifest
from prefect_gliner2.session_core.storage import absolute_uri, resolve
from prefect_gliner2.tasks.export import export_model

__all__ = [
    "PreparedRun",
    "TrainingConfigModel",
    "TrainingSettings",
    "default_storage",
    "prepare_run",
    "train_flow",
    "use_prepared",
]

STORAGE_ENV = "PREFECT_GLINER2_STORAGE"
DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]+)?)$"
DEFAULT_KEEP_CHECKPOINTS = 3


# ---- parameters --------------------------------------------------------------------------------------------

TrainingConfigModel = TrainingSettings  # the earlier name of the config parameter's model


def default_storage() -> str:
    """$PREFECT_GLINER2_STORAGE, else ~/.prefect-gliner2/runs."""
    return os.environ.get(STORAGE_ENV) or os.path.join(os.path.expanduser("~"), ".prefect-gliner2", "runs")


# ---- preparing a run (torch-free, before the lease) --------------------------------------------------------


@dataclass
class PreparedRun:
    run_dir: RunDirectory
    plan: ManagedTrainingPlan
    manifest: bytes | None  # None: the run directory's own manifest is used (resume without data)
    content_address: str
    has_validation: bool
    model: str
    inputs: tuple[Any, ...] = ()  # what it was prepared from (see ``use_prepared``)


def prepare_run(
    model: str,
    train_data: Any,
    valid_data: Any,
    config: TrainingConfig | None,
    run_key: str | None,
    storage: str | None,
) -> PreparedRun:
    """Plan the run (or load its manifest when no training data is given) and locate its run directory."""
    if run_key is not None:
        validate_run_key(run_key)
    architecture = model_architecture(model)
    storage = storage or default_storage()
    if train_data is None:
        if run_key is None:
            raise ConfigError("train_data is required for a new run; to resume without it, pass the run_key")
        run_dir = RunDirectory(storage, run_key)
        if not run_dir.exists(layout.MANIFEST_FILE):
            raise ConfigError(
                f"run key {run_key!r} has no manifest at {run_dir.uri}; pass train_data and config to start it"
            )
        loaded = load_manifest(run_dir.manifest_uri)
        if config is not None and config.to_dict() != loaded.plan.config.to_dict():
            raise RunConflictError(
                f"run key {run_key!r} was planned with a different config; omit config to resume "
                "with the recorded one, or use a new run key"
            )
        inputs = _inputs_key(model, train_data, valid_data, config, run_dir)
        return PreparedRun(
            run_dir, loaded.plan, None, loaded.content_address, len(loaded.eval_records) > 0, model, inputs
        )
    if config is None:
        raise ConfigError("config is required for a new run: pass TrainingConfig fields (at least fp16 and bf16)")
    try:
        plan = ManagedTrainingPlan(train_data, config, architecture=architecture)
        manifest = encode_manifest(plan, valid_data)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"data file {exc.filename or exc} does not exist; pass JSONL path(s) or URL(s) that exist"
        ) from None
    address = manifest.content_address
    key = run_key if run_key is not None else f"{architecture}-{address[:16]}"
    validate_run_key(key)
    run_dir = RunDirectory(storage, key)
    inputs = _inputs_key(model, train_data, valid_data, config, run_dir)
    return PreparedRun(run_dir, plan, manifest.data, address, manifest.eval_record_count > 0, model, inputs)


def _inputs_key(
    model: str, train_data: Any, valid_data: Any, config: TrainingConfig | None, run_dir: RunDirectory
) -> tuple[Any, ...]:
    return (model, train_data, valid_data, config.to_dict() if config is not None else None, run_dir.uri)


_PREPARED: ContextVar[PreparedRun | None] = ContextVar("prefect_gliner2_prepared_run", default=None)


@contextmanager
def use_prepared(run: PreparedRun) -> Iterator[PreparedRun]:
    """Inside this block, a ``train_flow`` call in this thread for the same model, run key and storage uses `run`
    (from ``prepare_run``) instead of planning again: a caller that planned first, to report bad input before a
    flow run exists, passes the flow the same parameters and the planning is done once."""
    token = _PREPARED.set(run)
    try:
        yield run
    finally:
        _PREPARED.reset(token)


def _prepare(
    model: str,
    train_data: Any,
    valid_data: Any,
    config: TrainingConfig | None,
    run_key: str | None,
    storage_url: str | None,
) -> PreparedRun:
    """The run the caller prepared for exactly these inputs (see ``use_prepared``), else ``prepare_run``'s."""
    given = _PREPARED.get()
    if given is not None and run_key is not None:
        run_dir = RunDirectory(storage_url or default_storage(), validate_run_key(run_key))
        if given.inputs == _inputs_key(model, train_data, valid_data, config, run_dir):
            return given
    return prepare_run(model, train_data, valid_data, config, run_key, storage_url)


# ---- the flow ----------------------------------------------------------------------------------------------


def _close_workers(flow: Any, flow_run: Any, state: Any) -> None:
    """Final failure/crash/cancellation: no retry will reuse this flow run's worker."""
    live_runs.close_for_flow_run(str(flow_run.id))


@flow(
    name="gliner2-train",
    persist_result=False,
    on_failure=[_close_workers],
    on_crashed=[_close_workers],
    on_cancellation=[_close_workers],
)
def train_flow(
    model: str,
    train_data: str | list[str] | None = None,
    valid_data: str | list[str] | None = None,
    config: TrainingSettings | None = None,
    run_key: str | None = None,
    storage: str | None = None,
    checkpoint_every: Annotated[int, Field(ge=0)] = 100,
    export_to: str | None = None,
    batches_per_task: Annotated[int, Field(ge=1)] = 1,
    pipeline_depth: Annotated[int, Field(ge=0, le=64)] = 0,
    device: Annotated[str, Field(pattern=DEVICE_PATTERN)] | None = None,
    cpu_threads: Annotated[int, Field(ge=1)] | None = None,
    init_weights: str | None = None,
    keep_checkpoints: Annotated[int, Field(ge=1)] | None = DEFAULT_KEEP_CHECKPOINTS,
    lease_ttl: Annotated[float, Field(ge=1)] = DEFAULT_LEASE_TTL,
    lease_wait: Annotated[float, Field(ge=0)] = DEFAULT_LEASE_WAIT,
    background_checkpoints: bool = False,
) -> dict[str, Any]:
    """Fine-tune a GLiNER2 model exactly and resumably; returns a summary with the exported model's location.

    Args:
        model: A local model directory, a Hugging Face model id, or a built-in tiny:span / tiny:boundary.
        train_data: JSONL path(s) or fsspec URL(s) of training records; empty to resume an existing run key.
        valid_data: JSONL path(s) or URL(s) of validation records (enables validation and best-model selection).
        config: Training settings of a new run (empty to resume with the recorded ones); precision defaults to fp32.
        run_key: Names the run directory; the same key resumes. Default: derived from the manifest's content.
        storage: fsspec URL or local directory holding run directories (default: $PREFECT_GLINER2_STORAGE, else
            ~/.prefect-gliner2/runs).
        checkpoint_every: Checkpoint after every N optimizer updates (0: only at epoch ends).
        export_to: Where to export the selected model (default: the export folder of the run directory,
            STORAGE/RUN_KEY/export).
        batches_per_task: Batches per Prefect task (raise it when steps take only a few milliseconds).
        pipeline_depth: Operations sent to the worker ahead of their task (0: none).
        device: "cpu", "cuda" or "cuda:N" (default: CUDA when available).
        cpu_threads: Torch threads in the worker (recorded on first use; default: this worker slot's share of the
            CPUs, see runtime/resources.py: $PREFECT_GLINER2_CPU_THREADS, else $OMP_NUM_THREADS, else usable CPUs
            divided by $PREFECT_GLINER2_WORKER_SLOTS).
        init_weights: Start a new run from these weights (fresh optimizer and schedule): a native model directory,
            a PEFT adapter directory, an export directory (its adapter/ is used for LoRA) or a session checkpoint.
            Recorded with the run: a resume must pass the same value.
        keep_checkpoints: Keep the newest N checkpoints (plus the one taken at the best validation step and the one
            the cursor names); older ones are deleted once a newer checkpoint is committed. None keeps all.
        lease_ttl: Seconds a remote-storage lease lives without a heartbeat (the holder renews it every ttl/3).
        lease_wait: Seconds to wait for a run key held by another live run before failing. A lease of this same
            flow run, of a process gone from this host, or of a flow run that Prefect reports final or CRASHED is
            taken over at once.
        background_checkpoints: Write checkpoints while training continues: costs one checkpoint's size of extra
            host RAM while a write is in flight. The cursor moves once a checkpoint is written; results are the same.
    """
    logger = get_run_logger()
    prepared = _prepare(
        model, train_data, valid_data, config.to_training_config() if config else None, run_key, storage
    )
    if init_weights is not None:
        _check_init_weights(init_weights)
    check_runnable(prepared.plan.config, prepared.has_validation, device)
    run_dir = prepared.run_dir
    flow_run_id = _flow_run_id()
    run_dir.create()
    lease = RunLease(run_dir, flow_run_id=flow_run_id, ttl=lease_ttl, wait=lease_wait, holder_gone=holder_flow_run_gone)
    previous = (lease.last_holder() or {}).get("flow_run_id")
    lease.acquire()
    for reason in lease.took_over:
        logger.warning("took over the lease of run key %s from %s", run_dir.run_key, reason)
    succeeded = False
    try:
        export_uri = absolute_uri(export_to) if export_to else run_dir.default_export_uri
        done = _completed(run_dir, export_uri)
        live = _open(
            prepared,
            lease,
            flow_run_id,
            device,
            cpu_threads,
            prewarm=done is None,
            export_uri=export_uri,
            init_weights=init_weights,
            keep_checkpoints=keep_checkpoints,
        )
        logger.info(
            "run %s at %s: %d batches, %d updates, plan %s",
            run_dir.run_key,
            run_dir.uri,
            prepared.plan.batch_count,
            prepared.plan.max_steps,
            prepared.plan.fingerprint[:12],
        )
        if done is None:
            _check_hardware(live, bool(prepared.plan.config.bf16), device)
        if done is not None:
            logger.info("run %s is complete; its model is at %s", run_dir.run_key, export_uri)
            succeeded = True
            summary = {**done, "units_run": 0, "worker_starts": 0, "flow_run_id": flow_run_id, **disk_used(run_dir)}
            return _completed_state(f"{run_dir.run_key}: already complete; model at {export_uri}", summary)
        summary, where = _train(
            live,
            prepared,
            checkpoint_every=checkpoint_every,
            export_uri=export_uri,
            batches_per_task=batches_per_task,
            pipeline_depth=pipeline_depth,
            previous=previous,
            background_checkpoints=background_checkpoints,
        )
        succeeded = True
        return _completed_state(f"{run_dir.run_key}: {where} · done; model at {summary['export']}", summary)
    except BaseException as exc:
        if not (is_transient(exc) and _retry_follows()):
            live_runs.unregister(run_dir.run_key)
            emit_failed(run_dir, flow_run_id, exc)
        code = permanent_storage_errno(exc)
        if code is not None and not isinstance(exc, StorageFullError):
            raise storage_full_error(code, f"{type(exc).__name__}: {exc}") from exc
        raise
    finally:
        if succeeded:
            live_runs.unregister(run_dir.run_key)
        lease.release()


def _open(
    prepared: PreparedRun,
    lease: RunLease,
    flow_run_id: str | None,
    device: str | None,
    cpu_threads: int | None,
    *,
    prewarm: bool,
    export_uri: str,
    init_weights: str | None = None,
    keep_checkpoints: int | None = None,
) -> LiveRun:
    """Inside the lease: clean debris, write/check the manifest and settings, start (or reuse) the worker."""
    run_dir = prepared.run_dir
    logger = get_run_logger()
    existing = live_runs.lookup(run_dir.run_key)
    if existing is not None:
        existing.worker.settle()  # a background checkpoint write of a previous attempt's worker is not debris
    removed = run_dir.remove_debris(export_uri)
    if removed:
        logger.info("removed debris of an interrupted run: %s", ", ".join(removed))
    if prepared.manifest is not None and run_dir.ensure_manifest(prepared.manifest):
        logger.info("new run %s: manifest written to %s", run_dir.run_key, run_dir.manifest_uri)
    damaged = run_dir.recover_damaged_restore_point(prepared.plan.epoch)  # the index only: no payload is read
    if damaged:
        _log_damaged(run_dir, damaged)
    recorded = run_dir.read_run_info() or {}
    threads = cpu_threads or recorded.get("cpu_threads") or default_cpu_threads()
    run_dir.ensure_run_info(
        {"model": prepared.model, "device": device or "auto", "cpu_threads": threads, "init_weights": init_weights}
    )
    spec = WorkerSpec(
        model=prepared.model,
        manifest_uri=run_dir.manifest_uri,
        cpu_threads=threads,
        device=device,
        init_weights=init_weights,
        faults=faults.installed(),  # None unless test code installed a fault plan in this process
    )
    if (
        existing is not None
        and existing.flow_run_id == flow_run_id
        and existing.worker.alive
        and existing.worker.spec == spec
        and existing.content_address == prepared.content_address
    ):
        worker = existing.worker
        logger.info("reusing the live session worker (pid %s) of the previous attempt", worker.pid)
    else:
        live_runs.unregister(run_dir.run_key)
        worker = SessionWorker(spec, restore_locator=run_dir.newest_checkpoint_uri, name=f"gliner2-{run_dir.run_key}")
        if prewarm:
            worker.start()  # the child imports torch and restores while the flow sets up
            if run_dir.read_cursor() is not None:
                _restored_or_fallen_back(worker, run_dir, prepared.plan.epoch)
    live = LiveRun(
        run_dir.run_key,
        run_dir,
        prepared.plan.fingerprint,
        prepared.content_address,
        worker,
        lease,
        flow_run_id,
        prepared.plan,
        keep_checkpoints,
    )
    live_runs.register(live)
    return live


def _restored_or_fallen_back(worker: SessionWorker, run_dir: RunDirectory, epoch_of: Any) -> None:
    """Wait for the worker's restore, the only full (verified) read of the checkpoint. When it finds the checkpoint
    damaged, move it aside, rewind the cursor to the previous intact one and restore that instead (CheckpointError
    when no earlier checkpoint is intact)."""
    while True:
        worker.start()
        try:
            worker.call(Status())
            return
        except CheckpointDamagedError as exc:
            damaged = run_dir.fall_back_from(worker.restored_from or "", exc, epoch_of)
            _log_damaged(run_dir, damaged)


def _log_damaged(run_dir: RunDirectory, damaged: str) -> None:
    restore = run_dir.read_cursor()
    get_run_logger().warning(
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


def _completed(run_dir: RunDirectory, export_uri: str) -> dict[str, Any] | None:
    """The recorded summary when this run already finished and exported to `export_uri`, else None."""
    cursor = run_dir.read_cursor()
    if cursor is None or not cursor.finished or cursor.export != export_uri or cursor.summary is None:
        return None
    fs, path = resolve(export_uri)
    return dict(cursor.summary) if fs.exists(f"{path}/{layout.EXPORT_MARKER_FILE}") else None


def _train(
    live: LiveRun,
    prepared: PreparedRun,
    *,
    checkpoint_every: int,
    export_uri: str,
    batches_per_task: int,
    pipeline_depth: int,
    previous: str | None,
    background_checkpoints: bool = False,
) -> tuple[dict[str, Any], str]:
    """Drive the run to its end and export; returns the summary and the final position in words."""
    logger = get_run_logger()
    run_dir, plan = live.run_dir, prepared.plan
    cursor = run_dir.read_cursor()
    start = cursor.cursor if cursor is not None else 0
    if cursor is not None:
        logger.info(
            "resuming run %s from checkpoint %s (batch %d of %d, step %d)",
            live.run_key,
            cursor.checkpoint,
            start,
            plan.batch_count,
            cursor.step,
        )
    reporter = RunReporter(live.run_key, plan, flow_run_id=live.flow_run_id, run_dir=run_dir.uri)
    try:
        reporter.introduce(resumes=previous)
        reporter.start(start, cursor.step if cursor else 0)
        emit_start(live, cursor, previous, export_uri)
        outcome = DriveResult()
        if cursor is None or not cursor.finished:
            outcome = drive(
                live,
                start,
                batches_per_task=batches_per_task,
                checkpoint_every=checkpoint_every,
                pipeline_depth=pipeline_depth,
                validate_runs=prepared.has_validation,
                reporter=reporter,
                then=Export(uri=export_uri, which="best"),
                background_checkpoints=background_checkpoints,
            )
        info = export_model(live.run_key, export_uri, "best")
        final = run_dir.read_cursor()
        summary = _summary(live, info, final, start, outcome)
        reporter.validations = list(info.summary.eval_metrics_history or reporter.validations)
        if final is not None and final.finished:
            durable = {k: v for k, v in summary.items() if k not in _PER_ATTEMPT}
            run_dir.commit_cursor(dataclasses.replace(final, export=export_uri, summary=durable))
        summary.update(disk_used(run_dir))
        reporter.finish(summary, cursor=final)
        emit_run_event(
            RUN_COMPLETED,
            live.run_key,
            live.flow_run_id,
            {
                k: summary.get(k)
                for k in ("run_dir", "export", "total_steps", "best_metric", "best_step", "stopped_early")
            }
            | {"checkpoint": run_dir.checkpoint_uri(final.checkpoint) if final is not None else None},
        )
        return summary, reporter.where()
    finally:
        reporter.close(timeout=5.0)


def _completed_state(message: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The flow run ends in a Completed state whose message is the final position; callers receive `summary`.

    Only on a run's first attempt: after an attempt failed in this process, Prefect 3.9's engine answers a
    returned State with that attempt's exception (``FlowRunEngine.result`` checks ``_raised`` first), so a retried
    attempt returns the summary itself and its state message stays Prefect's default.
    """
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow_run.run_count > 1:
        return summary
    return cast(dict[str, Any], Completed(message=message, data=summary))


_PER_ATTEMPT = ("units_run", "worker_starts", "flow_run_id", "disk_bytes", "checkpoint_bytes", "checkpoints_kept")


def _summary(live: LiveRun, info: ExportResult, cursor: Any, start: int, outcome: DriveResult) -> dict[str, Any]:
    native = info.summary
    best = native.best_metric
    return {
        "run_key": live.run_key,
        "run_dir": live.run_dir.uri,
        "export": info.uri,
        "label": info.label,
        "checkpoint": cursor.checkpoint if cursor is not None else None,
        "checkpoints": live.run_dir.checkpoints_uri,
        "total_steps": native.total_steps,
        "total_epochs": native.total_epochs,
        "best_metric": best if isinstance(best, (int, float)) and abs(best) != float("inf") else None,
        "best_step": native.best_step,
        "metric_for_best": live.plan.config.metric_for_best,
        "stopped_early": bool(native.stopped_early),
        "batch_count": live.plan.batch_count,
        "resumed_from_batch": start,
        "units_run": outcome.units_run,
        "worker_starts": live.worker.starts,
        "fingerprint": live.fingerprint,
        "content_address": live.content_address,
        "flow_run_id": live.flow_run_id,
    }


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def holder_flow_run_gone(claim: dict[str, Any]) -> str | None:
    """Why a lease holder's flow run provably no longer runs (final or CRASHED per the Prefect API), else None."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    flow_run_id = claim.get("flow_run_id")
    if not flow_run_id:
        return None
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(str(flow_run_id))).state
    except (ObjectNotFound, ValueError):
        return None  # not provable from here: wait for the TTL
    except Exception as exc:  # noqa: BLE001 - an unreachable API proves nothing: the TTL decides
        get_run_logger().warning("cannot ask Prefect about lease holder %s (%s); waiting for its TTL", flow_run_id, exc)
        return None
    if state is not None and state.type.value in FINAL_STATES:
        return f"its flow run {flow_run_id} is {state.name} per the Prefect API"
    return None


def _flow_run_id() -> str | None:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return str(context.flow_run.id) if context is not None and context.flow_run is not None else None


def _retry_follows() -> bool:
    """Whether Prefect will retry this flow run after this attempt fails (flow retries left)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return False
    retries = context.flow_run.empirical_policy.retries or 0
    return context.flow_run.run_count <= retries
