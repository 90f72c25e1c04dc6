"""``prefect-gliner2 train``: plan the run, record its manifest in the run directory, and run the training flow on
that run key (the flow resumes the recorded plan: planned here, once, before any flow run exists, and handed to the
flow run in this process, which so neither plans it again nor decodes its manifest)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from prefect_gliner2.flows.cli.args import UsageError, auto_or, data_arguments, inputs, non_negative, positive
from prefect_gliner2.flows.cli.progress import ProgressBar, describe
from prefect_gliner2.flows.cli.server import prefect_api
from prefect_gliner2.runtime.schedule import TARGET_TASK_SECONDS
from prefect_gliner2.runtime.spare import spare_worker

if TYPE_CHECKING:
    from prefect_gliner2.flows.params import CheckpointSettings, ExecutionSettings

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "train", help="train (or resume) a run through the Prefect flow"
    )
    data_arguments(parser, config_required=False)
    parser.add_argument("--run-key", help="names the run directory; the same key resumes (default: from the plan)")
    parser.add_argument("--storage", help="local directory or fsspec URL for run directories")
    parser.add_argument("--export", dest="export_to", help="where to export the selected model (default: <run>/export)")
    parser.add_argument(
        "--checkpoint-every",
        type=auto_or(non_negative),
        default="auto",
        help="checkpoint every N updates (default auto: every 100, fewer when steps are short: at least 30 s apart)",
    )
    parser.add_argument(
        "--batches-per-task",
        type=auto_or(positive),
        default="auto",
        help="batches per Prefect task (default auto: grown from the measured step time to tasks of about "
        f"{TARGET_TASK_SECONDS:g} s)",
    )
    parser.add_argument(
        "--pipeline-depth",
        type=auto_or(non_negative),
        default="auto",
        help="operations sent ahead to the worker (default auto: 2)",
    )
    parser.add_argument(
        "--background-checkpoints",
        action="store_true",
        help="write checkpoints while training continues (costs one checkpoint's size of extra host RAM)",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--cpu-threads", type=positive, help="torch threads in the worker (recorded per run)")
    parser.add_argument("--json", action="store_true", help="print the run summary as JSON")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.flows.params import check_runnable
    from prefect_gliner2.runtime.prepare import handed_over, prepare_run, record_manifest

    settings = _settings(args)
    config, train, valid = inputs(args)
    with spare_worker():  # a worker process imports torch and gliner2 while the run is planned and Prefect starts
        prepared = prepare_run(args.model, train, valid, config, args.run_key, args.storage)
        check_runnable(prepared.plan.config, prepared.has_validation, args.device)
        record_manifest(prepared)  # refuses another plan under this run key before Prefect starts
        with prefect_api(), handed_over(prepared):  # the flow run's prepare_run answers with this plan
            state = _run_flow(args, prepared.run_dir.run_key, *settings)
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        print(
            f"prefect-gliner2 train: run {prepared.run_dir.run_key} failed: {error}\n"
            "fix the cause and run the same command again to resume from the last checkpoint",
            file=sys.stderr,
        )
        return 1
    summary = state.result()
    print(json.dumps(summary, indent=1) if args.json else describe(summary))
    return 0


def _settings(args: Any) -> tuple[CheckpointSettings, ExecutionSettings]:
    """The flow's checkpointing and execution settings from the arguments (exit 2 on a value they refuse)."""
    from pydantic import ValidationError

    from prefect_gliner2.flows.params import CheckpointSettings, ExecutionSettings

    try:
        checkpointing = CheckpointSettings(
            checkpoint_every=args.checkpoint_every, background_checkpoints=args.background_checkpoints
        )
        execution = ExecutionSettings(
            batches_per_task=args.batches_per_task,
            pipeline_depth=args.pipeline_depth,
            device=args.device,
            cpu_threads=args.cpu_threads,
        )
    except ValidationError as exc:
        raise UsageError("; ".join(_refusal(error) for error in exc.errors())) from None
    return checkpointing, execution


def _refusal(error: Any) -> str:
    option = "--" + str(error["loc"][0]).replace("_", "-")
    if option == "--device":
        return f"--device {error['input']!r}: pass cpu, cuda or cuda:N"
    return f"{option}: {error['msg']}"


def _run_flow(args: Any, run_key: str, checkpointing: CheckpointSettings, execution: ExecutionSettings) -> Any:
    """The training flow on the recorded run key (no data: it resumes the manifest), with a progress bar."""
    from prefect_gliner2.flows.reporting import add_listener, remove_listener
    from prefect_gliner2.flows.train import train_flow

    bar = ProgressBar(sys.stderr)
    add_listener(bar)
    try:
        return train_flow(
            model=args.model,
            run_key=run_key,
            storage=args.storage,
            export_to=args.export_to,
            checkpointing=checkpointing,
            execution=execution,
            return_state=True,
        )
    finally:
        remove_listener(bar)
        bar.close()
