"""The training flow: one managed GLiNER2 training run = one flow run = one session worker process.

    from prefect_gliner2.flows.train import train_flow

    summary = train_flow(
        model="tiny:span",                      # or a model directory, or a Hugging Face id
        train_data="data/train.jsonl", valid_data="data/valid.jsonl",
        config={"fp16": False, "bf16": False, "num_epochs": 3, "batch_size": 8},
        run_key="ner-2024-06", storage="./runs",
        checkpointing={"checkpoint_every": 50}, execution={"batches_per_task": "auto", "pipeline_depth": "auto"},
    )
    summary["export"]                           # the selected (best, else final) model directory

Calling it again with the same run key -- or retrying the flow run, also after a crash -- continues exactly from
the durable cursor. With ``pause_at_step=S`` the run pauses at its first validation at or after S updates: it
checkpoints there, ends COMPLETED with a pause record as its summary (``summary["paused"]``; ``runtime.pause``) and
exports nothing; the same run key with a larger ``pause_at_step``, or none, continues it exactly. The run's
lifecycle (lease, run directory, worker, restore, completion, the cursor's export record) is ``runtime.run``'s; this
flow composes it with the tasks that drive the plan and export the model.
Importing this module does not import torch: training happens in the worker process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, cast

from prefect import get_run_logger
from pydantic import Field

from prefect_gliner2.flows.context import run_hooks
from prefect_gliner2.flows.data_params import DataSettings
from prefect_gliner2.flows.driver import DriveResult, drive
from prefect_gliner2.flows.events import emit_run_event, emit_start
from prefect_gliner2.flows.params import (
    CheckpointSettings,
    ExecutionSettings,
    LeaseSettings,
    TrainingSettings,
    check_runnable,
)
from prefect_gliner2.flows.prefect_compat import completed_state, interrupts_surface
from prefect_gliner2.flows.reporting import RunReporter, mlflow_tracking
from prefect_gliner2.flows.spare_first import spare_first_flow
from prefect_gliner2.runtime import live_runs
from prefect_gliner2.runtime.events import RUN_COMPLETED
from prefect_gliner2.runtime.onnx_step import check_onnx_step, eval_examples
from prefect_gliner2.runtime.pause import pause_index, pause_record, record_pause
from prefect_gliner2.runtime.prepare import prepare_run
from prefect_gliner2.runtime.protocol import Export, Summary, SummaryResult, ValidateResult
from prefect_gliner2.runtime.run import OpenRun, RunOptions, finish, open_run
from prefect_gliner2.runtime.schedule import TaskGrain, pipeline_depth
from prefect_gliner2.runtime.spare import discard_spare, spare_worker
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.tasks.export import export_model
from prefect_gliner2.tasks.onnx import export_onnx_step

__all__ = ["TrainingConfigModel", "TrainingSettings", "run_options", "train_flow"]

TrainingConfigModel = TrainingSettings  # the earlier name of the config parameter's model

DEFAULT_CHECKPOINTING = CheckpointSettings()
DEFAULT_EXECUTION = ExecutionSettings()
DEFAULT_LEASE = LeaseSettings()
DEFAULT_DATA = DataSettings()


def run_options(
    export_to: str | None,
    init_weights: str | None,
    checkpointing: CheckpointSettings,
    execution: ExecutionSettings,
    lease: LeaseSettings,
) -> RunOptions:
    """The lifecycle's options from the flow's parameter groups."""
    return RunOptions(
        export_to=export_to,
        init_weights=init_weights,
        device=execution.device,
        cpu_threads=execution.cpu_threads,
        keep_checkpoints=checkpointing.keep_checkpoints,
        lease_ttl=lease.lease_ttl,
        lease_wait=lease.lease_wait,
    )


def _close_workers(flow: Any, flow_run: Any, state: Any) -> None:
    """Final failure/crash/cancellation: no retry will reuse this flow run's worker."""
    live_runs.close_for_flow_run(str(flow_run.id))


@spare_first_flow(  # a call starts the worker process before Prefect creates the flow run
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
    export_to: str | None = None,
    init_weights: str | None = None,
    checkpointing: CheckpointSettings = DEFAULT_CHECKPOINTING,
    execution: ExecutionSettings = DEFAULT_EXECUTION,
    lease: LeaseSettings = DEFAULT_LEASE,
    pause_at_step: Annotated[int | None, Field(ge=1)] = None,
    data_format: DataSettings = DEFAULT_DATA,
    onnx: list[Literal["fp32", "fp16", "int8"]] | None = None,
) -> dict[str, Any]:
    """Fine-tune a GLiNER2 model exactly and resumably; returns a summary with the exported model's location.

    Args:
        model: A local model directory, a Hugging Face model id, or a built-in tiny:span / tiny:boundary.
        train_data: Path(s) or fsspec URL(s) of training data (any data_format); empty to resume an existing run key.
        valid_data: Path(s) or URL(s) of validation data (enables validation and best-model selection).
        config: Training settings of a new run (empty to resume with the recorded ones); precision defaults to fp32.
        run_key: Names the run directory; the same key resumes. Default: derived from the manifest's content.
        storage: fsspec URL or local directory holding run directories (default: $PREFECT_GLINER2_STORAGE, else
            ~/.prefect-gliner2/runs).
        export_to: Where to export the selected model (default: the export folder of the run directory,
            STORAGE/RUN_KEY/export).
        init_weights: Start a new run from these weights (fresh optimizer and schedule): a native model directory,
            a PEFT adapter directory, an export directory (its adapter/ is used for LoRA) or a session checkpoint.
            Recorded with the run: a resume must pass the same value.
        checkpointing: When checkpoints are taken, how many are kept and whether they are written in the background.
        execution: Batches per task, operations sent ahead, the device and the worker's CPU threads.
        lease: How long the run key's lease lives without a heartbeat, and how long to wait for a busy run key.
        pause_at_step: Pause at the first validation at or after this many optimizer updates, checkpointed there
            (needs valid_data); the same run key with a larger value, or none, continues exactly from there.
        data_format: The format of train_data and valid_data (auto: detected from each file: CoNLL/BIO, spaCy,
            Label Studio, doccano or gliner2's records) and that format's settings.
        onnx: Also export the model to ONNX for these precisions (fp32, fp16, int8) into the export's onnx/ folder,
            behind the parity gate on the validation records (span models, entity tasks; checked before training;
            needs the onnx extra). The summary's ``onnx`` holds each precision's figures.
    """
    config_given = config.to_training_config() if config else None
    with interrupts_surface(), spare_worker():
        train, read = data_format.source(train_data, "training")
        valid, valid_read = data_format.source(valid_data, "validation")
        for line in read + valid_read:
            get_run_logger().info("data %s", line)
        prepared = prepare_run(model, train, valid, config_given, run_key, storage)  # or the CLI's (handed over)
        check_runnable(prepared.plan.config, prepared.has_validation, execution.device)
        if pause_at_step is not None and not prepared.has_validation:
            raise ConfigError("pause_at_step pauses a run at a validation point: pass valid_data (or drop it)")
        if onnx:
            examples = eval_examples(prepared.manifest, prepared.run_dir.manifest_uri)
            check_onnx_step(onnx, prepared.plan.architecture, examples, seed=prepared.plan.config.seed)
        options = run_options(export_to, init_weights, checkpointing, execution, lease)
        with open_run(prepared, options, run_hooks()) as run:
            discard_spare()  # adopted by the run's worker by now, unless none started (a finished run, a reused one)
            if run.done is not None:
                get_run_logger().info("run %s is complete; its model is at %s", run.run_key, run.export_uri)
                message = f"{run.run_key}: already complete; model at {run.export_uri}"
                return cast(dict[str, Any], completed_state(message, _with_onnx(run.completed_summary(), run, onnx)))
            summary, message = _train(run, checkpointing, execution, pause_at_step)
            return cast(dict[str, Any], completed_state(message, _with_onnx(summary, run, onnx)))


def _with_onnx(summary: dict[str, Any], run: OpenRun, onnx: Sequence[str] | None) -> dict[str, Any]:
    """The summary with the ONNX step's figures (``onnx``) when it was asked for: the step runs once the run is
    finished (not at a pause; a refusal by the parity gate fails the flow run; the torch model stays exported)."""
    if not onnx or summary.get("paused") or not summary.get("export"):
        return summary
    seed = run.prepared.plan.config.seed
    return {**summary, "onnx": export_onnx_step(summary["export"], run.run_dir.manifest_uri, onnx, seed)}


def _train(
    run: OpenRun, checkpointing: CheckpointSettings, execution: ExecutionSettings, pause_at_step: int | None
) -> tuple[dict[str, Any], str]:
    """Drive the run to its end (or its pause) through the tasks, export and finish; returns the summary (or the
    pause record) and the flow run's state message."""
    live, cursor, plan = run.live, run.cursor, run.prepared.plan
    assert live is not None, "the run is open"
    pause_at = None
    if pause_at_step is not None and (cursor is None or not cursor.finished):
        if cursor is not None and cursor.step >= pause_at_step:
            return _paused(run, pause_at_step, None)
        pause_at = pause_index(plan, run.start, pause_at_step)
    if cursor is not None:
        get_run_logger().info(
            "resuming run %s from checkpoint %s (batch %d of %d, step %d)",
            run.run_key,
            cursor.checkpoint,
            run.start,
            plan.batch_count,
            cursor.step,
        )
    tracking = mlflow_tracking(run.run_key, plan, run.prepared.model, live.flow_run_id)
    reporter = RunReporter(run.run_key, plan, flow_run_id=live.flow_run_id, run_dir=run.run_dir.uri, tracking=tracking)
    try:
        reporter.introduce(resumes=run.previous)
        restored = _restored_history(live) if cursor is not None else None
        reporter.start(run.start, cursor.step if cursor else 0, restored=restored)
        emit_start(live, cursor, run.previous, run.export_uri)
        outcome = DriveResult()
        if cursor is None or not cursor.finished:
            outcome = drive(
                live,
                run.start,
                batches_per_task=TaskGrain.of(execution.batches_per_task),
                checkpoint_every=checkpointing.checkpoint_every,
                pipeline_depth=pipeline_depth(execution.pipeline_depth),
                validate_runs=run.prepared.has_validation,
                reporter=reporter,
                then=Export(uri=run.export_uri, which="best"),
                background_checkpoints=checkpointing.background_checkpoints,
                pause_at=pause_at,
            )
        if outcome.paused is not None and pause_at_step is not None:
            return _paused(run, pause_at_step, outcome.paused)
        info = export_model(run.run_key, run.export_uri, "best")
        summary, final = finish(run, info, units_run=outcome.units_run)
        for warning in summary.get("warnings") or ():
            get_run_logger().warning("run %s: WARNING: %s", run.run_key, warning)
        reporter.validations = list(info.summary.eval_metrics_history or reporter.validations)
        reporter.finish(summary, cursor=final)
        _announce_completed(run, summary, final)
        return summary, f"{run.run_key}: {reporter.where()} · done; model at {summary['export']}"
    finally:
        reporter.close(timeout=5.0)


def _paused(run: OpenRun, pause_at_step: int, validation: ValidateResult | None) -> tuple[dict[str, Any], str]:
    """The run paused at its durable cursor (after `validation`, or found there): keep the pause record in the
    cursor and return it with the state message. A record kept by an earlier attempt at this position is reused;
    without one, the worker's restored state says what the validations were."""
    cursor = run.run_dir.read_cursor()
    assert cursor is not None, "a paused run has a committed checkpoint"
    if validation is None and cursor.summary is not None and cursor.summary.get("paused"):
        record = dict(cursor.summary)
    else:
        known = validation or run.worker.call(Summary())
        history = known.history if isinstance(known, ValidateResult) else known.eval_metrics_history
        record = pause_record(
            run.run_dir,
            run.prepared.plan,
            cursor,
            history,
            pause_at_step=pause_at_step,
            best_metric=known.best_metric,
            best_step=known.best_step,
        )
        run.lease.check()  # a run that lost its run key records nothing
        record_pause(run.run_dir, record)
    get_run_logger().info(
        "run %s paused at step %d (checkpoint %s); the same run key continues it exactly",
        run.run_key,
        record["total_steps"],
        record["checkpoint"],
    )
    record = {**record, "flow_run_id": run.hooks.flow_run_id}
    message = f"{run.run_key}: paused at step {record['total_steps']} of {record['max_steps']}; the run key resumes it"
    return record, message


def _restored_history(live: Any) -> SummaryResult | None:
    """What the worker restored, with its training history (the curves start from it): the worker read the
    checkpoint once, so the flow process never reads its payload. None when the worker cannot say (reporting never
    fails a run: the curves then start here)."""
    try:
        return live.worker.call(Summary(train_history=True))
    except Exception as exc:  # noqa: BLE001
        get_run_logger().warning("could not read the restored training history for the curves: %s", exc)
        return None


def _announce_completed(run: OpenRun, summary: dict[str, Any], final: Any) -> None:
    keys = ("run_dir", "export", "total_steps", "best_metric", "best_step", "stopped_early")
    checkpoint = run.run_dir.checkpoint_uri(final.checkpoint) if final is not None else None
    payload = {k: summary.get(k) for k in keys} | {"checkpoint": checkpoint}
    emit_run_event(RUN_COMPLETED, run.run_key, run.hooks.flow_run_id, payload)
