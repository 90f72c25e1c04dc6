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
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import fsspec
from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from prefect_gliner2.flows.driver import DriveResult, drive
from prefect_gliner2.flows.reporting import RunReporter
from prefect_gliner2.runtime import live_runs
from prefect_gliner2.runtime.errors import (
    RunConflictError,
    StorageFullError,
    is_transient,
    permanent_storage_errno,
    storage_full_error,
)
from prefect_gliner2.runtime.lease import DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT, RunLease
from prefect_gliner2.runtime.live_runs import LiveRun
from prefect_gliner2.runtime.model_sources import model_architecture
from prefect_gliner2.runtime.resources import default_cpu_threads, disk_used
from prefect_gliner2.runtime.rundir import RunDirectory, validate_run_key
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.manifest import load_manifest
from prefect_gliner2.tasks.export import export_model

__all__ = ["TrainingConfigModel", "default_storage", "prepare_run", "train_flow"]

STORAGE_ENV = "PREFECT_GLINER2_STORAGE"
DEFAULT_KEEP_CHECKPOINTS = 3


# ---- parameters --------------------------------------------------------------------------------------------


class _ConfigModelBase(BaseModel):
    """TrainingConfig as a pydantic model (a form in the Prefect UI); validation is TrainingConfig's own."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _accept_dataclass_and_name_unknowns(cls, data: Any) -> Any:
        if isinstance(data, TrainingConfig):
            return data.to_dict()
        if isinstance(data, Mapping):
            unknown = {k: v for k, v in data.items() if k not in cls.model_fields}
            if unknown:
                try:
                    TrainingConfig.from_dict(unknown)
                except ConfigError as exc:
                    raise ValueError(str(exc)) from None
        return data

    @model_validator(mode="after")
    def _validate_with_training_config(self) -> Any:
        try:
            self.to_training_config()
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    def to_training_config(self) -> TrainingConfig:
        return TrainingConfig.from_dict(self.model_dump())


def _build_config_model() -> type[_ConfigModelBase]:
    hints = typing.get_type_hints(TrainingConfig)
    fields: dict[str, Any] = {}
    for item in dataclasses.fields(TrainingConfig):
        default = item.default if item.default is not dataclasses.MISSING else item.default_factory()  # type: ignore[misc]
        annotation = hints[item.name]
        if isinstance(default, tuple):
            annotation, default = list[str], list(default)
        fields[item.name] = (annotation, Field(default=default))
    return create_model("TrainingConfigModel", __base__=_ConfigModelBase, **fields)


if TYPE_CHECKING:
    TrainingConfigModel = _ConfigModelBase
else:
    TrainingConfigModel = _build_config_model()
    TrainingConfigModel.__doc__ = "TrainingConfig fields (same names and defaults); validated by TrainingConfig."


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
        if not run_dir.exists("manifest.json"):
            raise ConfigError(
                f"run key {run_key!r} has no manifest at {run_dir.uri}; pass train_data and config to start it"
            )
        loaded = load_manifest(run_dir.manifest_uri)
        if config is not None and config.to_dict() != loaded.plan.config.to_dict():
            raise RunConflictError(
                f"run key {run_key!r} was planned with a different config; omit config to resume "
                "with the recorded one, or use a new run key"
            )
        return PreparedRun(run_dir, loaded.plan, None, loaded.content_address, len(loaded.eval_records) > 0, model)
    if config is None:
        raise ConfigError("config is required for a new run: pass TrainingConfig fields (at least fp16 and bf16)")
    try:
        plan = ManagedTrainingPlan(train_data, config, architecture=architecture)
        manifest = plan.manifest_bytes(valid_data)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"data file {exc.filename or exc} does not exist; pass JSONL path(s) or URL(s) that exist"
        ) from None
    parsed = json.loads(manifest)
    address = str(parsed["content_address"])
    key = run_key if run_key is not None else f"{architecture}-{address[:16]}"
    validate_run_key(key)
    return PreparedRun(RunDirectory(storage, key), plan, manifest, address, bool(parsed["eval_examples"]), model)


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
    config: TrainingConfigModel | None = None,
    run_key: str | None = None,
    storage: str | None = None,
    checkpoint_every: Annotated[int, Field(ge=0)] = 100,
    export_to: str | None = None,
    batches_per_task: Annotated[int, Field(ge=1)] = 1,
    pipeline_depth: Annotated[int, Field(ge=0, le=64)] = 0,
    device: str | None = None,
    cpu_threads: Annotated[int, Field(ge=1)] | None = None,
    init_weights: str | None = None,
    keep_checkpoints: Annotated[int, Field(ge=1)] | None = DEFAULT_KEEP_CHECKPOINTS,
    lease_ttl: Annotated[float, Field(ge=1)] = DEFAULT_LEASE_TTL,
    lease_wait: Annotated[float, Field(ge=0)] = DEFAULT_LEASE_WAIT,
) -> dict[str, Any]:
    """Fine-tune a GLiNER2 model exactly and resumably; returns a summary with the exported model's location.

    Args:
        model: A local model directory, a Hugging Face model id, or a built-in "tiny:span" / "tiny:boundary".
        train_data: JSONL path(s) or fsspec URL(s) of training records; omit to resume an existing run key.
        valid_data: JSONL path(s) or URL(s) of validation records (enables best-model selection).
        config: TrainingConfig fields (fp16 and bf16 must be given explicitly).
        run_key: Names the run directory; the same key resumes. Default: derived from the manifest's content.
        storage: fsspec URL or local directory holding run directories (default: $PREFECT_GLINER2_STORAGE or
            ~/.prefect-gliner2/runs).
        checkpoint_every: Checkpoint after every N optimizer updates (0: only at epoch ends).
        export_to: Where to export the selected model (default: <storage>/<run_key>/export).
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
    """
    logger = get_run_logger()
    prepared = prepare_run(
        model, train_data, valid_data, config.to_training_config() if config else None, run_key, storage
    )
    if init_weights is not None:
        _check_init_weights(init_weights)
    run_dir = prepared.run_dir
    flow_run_id = _flow_run_id()
    run_dir.create()
    lease = RunLease(run_dir, flow_run_id=flow_run_id, ttl=lease_ttl, wait=lease_wait, holder_gone=holder_flow_run_gone)
    lease.acquire()
    for reason in lease.took_over:
        logger.warning("took over the lease of run key %s from %s", run_dir.run_key, reason)
    succeeded = False
    try:
        export_uri = export_to or run_dir.default_export_uri
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
        if done is not None:
            logger.info("run %s is complete; its model is at %s", run_dir.run_key, export_uri)
            succeeded = True
            return {**done, "units_run": 0, "worker_starts": 0, "flow_run_id": flow_run_id, **disk_used(run_dir)}
        summary = _train(
            live,
            prepared,
            checkpoint_every=checkpoint_every,
            export_uri=export_uri,
            batches_per_task=batches_per_task,
            pipeline_depth=pipeline_depth,
        )
        succeeded = True
        return summary
    except BaseException as exc:
        if not (is_transient(exc) and _retry_follows()):
            live_runs.unregister(run_dir.run_key)
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
    removed = run_dir.remove_debris(export_uri)
    if removed:
        logger.info("removed debris of an interrupted run: %s", ", ".join(removed))
    if prepared.manifest is not None and run_dir.ensure_manifest(prepared.manifest):
        logger.info("new run %s: manifest written to %s", run_dir.run_key, run_dir.manifest_uri)
    damaged = run_dir.recover_damaged_restore_point(prepared.plan.epoch)
    if damaged:
        restore = run_dir.read_cursor()
        logger.warning(
            "checkpoint %s is damaged: moved aside as .damaged-%s-*; continuing from the previous intact "
            "checkpoint %s (batch %s)",
            damaged,
            damaged,
            restore.checkpoint if restore else None,
            restore.cursor if restore else None,
        )
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
    )
    existing = live_runs.lookup(run_dir.run_key)
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


def _check_init_weights(uri: str) -> None:
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.isdir(path):
        raise ConfigError(
            f"init_weights {uri!r} is not a directory; pass a model, adapter, export or checkpoint directory"
        )


def _completed(run_dir: RunDirectory, export_uri: str) -> dict[str, Any] | None:
    """The recorded summary when this run already finished and exported to `export_uri`, else None."""
    cursor = run_dir.read_cursor()
    if cursor is None or not cursor.finished or cursor.export != export_uri or cursor.summary is None:
        return None
    fs, path = fsspec.core.url_to_fs(export_uri)
    return dict(cursor.summary) if fs.exists(f"{path.rstrip('/')}/export.json") else None


def _train(
    live: LiveRun,
    prepared: PreparedRun,
    *,
    checkpoint_every: int,
    export_uri: str,
    batches_per_task: int,
    pipeline_depth: int,
) -> dict[str, Any]:
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
    reporter = RunReporter(live.run_key, plan, flow_run_id=live.flow_run_id)
    try:
        reporter.start(start, cursor.step if cursor else 0)
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
                then=("export", {"uri": export_uri, "which": "best"}),
            )
        info = export_model(live.run_key, export_uri, "best")
        final = run_dir.read_cursor()
        summary = _summary(live, info, final, start, outcome)
        reporter.validations = list(info.get("eval_metrics_history") or reporter.validations)
        if final is not None and final.finished:
            durable = {k: v for k, v in summary.items() if k not in _PER_ATTEMPT}
            run_dir.commit_cursor(dataclasses.replace(final, export=export_uri, summary=durable))
        summary.update(disk_used(run_dir))
        reporter.finish(summary)
        return summary
    finally:
        reporter.close(timeout=5.0)


_PER_ATTEMPT = ("units_run", "worker_starts", "flow_run_id", "disk_bytes", "checkpoint_bytes", "checkpoints_kept")


def _summary(live: LiveRun, info: dict[str, Any], cursor: Any, start: int, outcome: DriveResult) -> dict[str, Any]:
    best = info.get("best_metric")
    return {
        "run_key": live.run_key,
        "run_dir": live.run_dir.uri,
        "export": info.get("uri"),
        "label": info.get("label"),
        "checkpoint": cursor.checkpoint if cursor is not None else None,
        "checkpoints": live.run_dir.join("checkpoints"),
        "total_steps": info.get("total_steps"),
        "total_epochs": info.get("total_epochs"),
        "best_metric": best if isinstance(best, (int, float)) and abs(best) != float("inf") else None,
        "best_step": info.get("best_step"),
        "metric_for_best": live.plan.config.metric_for_best,
        "stopped_early": bool(info.get("stopped_early")),
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
