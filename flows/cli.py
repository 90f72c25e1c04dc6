"""Console script ``prefect-gliner2``: train, plan and demo from a terminal, through Prefect.

    prefect-gliner2 train --model DIR_OR_ID --train FILE --valid FILE --config FILE --run-key KEY \\
                          --storage DIR_OR_URL --export DIR
    prefect-gliner2 plan  --model DIR_OR_ID --train FILE [--valid FILE] --config FILE [--out manifest.json]
    prefect-gliner2 demo  [--dir DIR]
    prefect-gliner2 evaluate --model DIR --data FILE [--threshold T] [--json OUT]

``train`` runs the training flow through Prefect: against PREFECT_API_URL when set, else an embedded ephemeral
server. Re-running the same command after a crash resumes exactly. Bad arguments exit with status 2 and a message
saying what to fix; a failed run exits with 1. ``evaluate`` scores a model's extractions on gold records (per-label
precision, recall, F1 and support, then the totals) with gliner2's own batched inference, in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from prefect_gliner2.session_core.errors import SessionCoreError

__all__ = ["main"]

USAGE_ERROR = 2


class UsageError(Exception):
    """A command-line argument is wrong; exit 2 with this message."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (UsageError, SessionCoreError) as exc:
        print(f"prefect-gliner2 {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume from the last checkpoint", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefect-gliner2", description="Exact, resumable GLiNER2 fine-tuning on Prefect."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,plan,demo,evaluate}")
    train = commands.add_parser("train", help="train (or resume) a run through the Prefect flow")
    _data_arguments(train, config_required=True)
    train.add_argument("--run-key", help="names the run directory; the same key resumes (default: from the plan)")
    train.add_argument("--storage", help="local directory or fsspec URL for run directories")
    train.add_argument("--export", dest="export_to", help="where to export the selected model (default: <run>/export)")
    train.add_argument("--checkpoint-every", type=_non_negative, default=100, help="checkpoint every N updates")
    train.add_argument("--batches-per-task", type=_positive, default=1, help="batches per Prefect task")
    train.add_argument("--pipeline-depth", type=_non_negative, default=0, help="operations sent ahead to the worker")
    train.add_argument(
        "--background-checkpoints",
        action="store_true",
        help="write checkpoints while training continues (costs one checkpoint's size of extra host RAM)",
    )
    train.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    train.add_argument("--cpu-threads", type=_positive, help="torch threads in the worker (recorded per run)")
    train.add_argument("--json", action="store_true", help="print the run summary as JSON")
    train.set_defaults(handler=_train)
    plan = commands.add_parser("plan", help="build a plan; print its summary, the manifest, or write it")
    _data_arguments(plan, config_required=True)
    plan.add_argument("--out", help="write the manifest here (it contains the training data)")
    plan.add_argument("--print", dest="print_manifest", action="store_true", help="print the whole manifest JSON")
    plan.set_defaults(handler=_plan)
    demo = commands.add_parser("demo", help="train the built-in tiny model on generated data, offline")
    demo.add_argument("--dir", default="prefect-gliner2-demo", help="where data, runs and the model go")
    demo.set_defaults(handler=_demo)
    evaluate = commands.add_parser("evaluate", help="precision, recall and F1 of a model's extractions on gold records")
    evaluate.add_argument(
        "--model", required=True, help="an exported model directory (or tiny:span, a Hugging Face id)"
    )
    evaluate.add_argument("--data", required=True, action="append", help="gold JSONL path or URL (repeatable)")
    evaluate.add_argument("--threshold", type=_threshold, default=0.5, help="span threshold in [0, 1] (default 0.5)")
    evaluate.add_argument("--batch-size", type=_positive, default=8, help="texts per inference batch (default 8)")
    evaluate.add_argument("--json", dest="json_out", help="also write the report (metrics, totals, per label) here")
    evaluate.set_defaults(handler=_evaluate)
    return parser


def _data_arguments(parser: argparse.ArgumentParser, *, config_required: bool) -> None:
    parser.add_argument("--model", required=True, help="model directory, Hugging Face id, or tiny:span / tiny:boundary")
    parser.add_argument("--train", required=True, action="append", help="training JSONL path or URL (repeatable)")
    parser.add_argument("--valid", action="append", help="validation JSONL path or URL (repeatable)")
    parser.add_argument("--config", required=config_required, help="TrainingConfig fields as a JSON or YAML file")


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


# ---- commands ----------------------------------------------------------------------------------------------


def _inputs(args: Any) -> tuple[Any, list[str], list[str] | None]:
    """Check the model, data files and config before anything starts; returns (config, train, valid)."""
    import fsspec

    from prefect_gliner2.runtime.model_sources import check_model_source
    from prefect_gliner2.session_core import TrainingConfig

    check_model_source(args.model)
    for role, paths in (("training", args.train), ("validation", args.valid or [])):
        for path in paths:
            fs, local = fsspec.core.url_to_fs(path)
            if not fs.exists(local):
                raise UsageError(f"{role} data {path!r} does not exist; pass a JSONL file path or URL")
    config = TrainingConfig.from_file(args.config)
    if getattr(args, "storage", None):
        _check_storage(args.storage)
    return config, args.train, args.valid


def _check_storage(storage: str) -> None:
    """A local storage path must be (or be creatable as) a directory: find out before a flow run starts."""
    from prefect_gliner2.session_core.storage import is_local, resolve

    fs, path = resolve(storage)
    if not is_local(fs):
        return
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        raise UsageError(
            f"--storage {storage!r} cannot hold run directories ({probe!r} is not a writable directory); "
            "pass a writable directory or fsspec URL"
        )


def _train(args: Any) -> int:
    from prefect_gliner2.flows.train import prepare_run, use_prepared
    from prefect_gliner2.session_core.layout import MANIFEST_FILE

    config, train, valid = _inputs(args)
    prepared = prepare_run(args.model, _one(train), _one(valid), config, args.run_key, args.storage)
    if prepared.manifest is not None and prepared.run_dir.exists(MANIFEST_FILE):
        prepared.run_dir.ensure_manifest(prepared.manifest)  # refuses a different plan before Prefect starts
    from prefect_gliner2.flows.params import TrainingSettings
    from prefect_gliner2.flows.reporting import add_listener, remove_listener
    from prefect_gliner2.flows.train import train_flow

    bar = ProgressBar(sys.stderr)
    add_listener(bar)
    try:
        with use_prepared(prepared):  # the flow uses this plan instead of planning the same inputs again
            state = train_flow(
                model=args.model,
                train_data=_one(train),
                valid_data=_one(valid),
                config=TrainingSettings.model_validate(config),
                run_key=prepared.run_dir.run_key,
                storage=args.storage,
                checkpoint_every=args.checkpoint_every,
                export_to=args.export_to,
                batches_per_task=args.batches_per_task,
                pipeline_depth=args.pipeline_depth,
                background_checkpoints=args.background_checkpoints,
                device=args.device,
                cpu_threads=args.cpu_threads,
                return_state=True,
            )
    finally:
        remove_listener(bar)
        bar.close()
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        print(
            f"prefect-gliner2 train: run {prepared.run_dir.run_key} failed: {error}\n"
            "fix the cause and run the same command again to resume from the last checkpoint",
            file=sys.stderr,
        )
        return 1
    summary = state.result()
    print(json.dumps(summary, indent=1) if args.json else _describe(summary))
    return 0


def _one(paths: list[str] | None) -> str | list[str] | None:
    return paths[0] if paths and len(paths) == 1 else paths


def _plan(args: Any) -> int:
    from prefect_gliner2.runtime.model_sources import model_architecture
    from prefect_gliner2.session_core import ManagedTrainingPlan
    from prefect_gliner2.session_core.manifest import encode_manifest, write_manifest

    config, train, valid = _inputs(args)
    plan = ManagedTrainingPlan(_one(train), config, architecture=model_architecture(args.model))
    manifest = encode_manifest(plan, _one(valid))
    if args.out:
        write_manifest(manifest.data, args.out)
    if args.print_manifest:
        sys.stdout.write(manifest.data.decode("utf-8"))
        return 0
    print(
        f"plan {plan.fingerprint} ({plan.architecture}): {len(plan.records)} training records, "
        f"{manifest.eval_record_count} validation records\n"
        f"  {plan.batch_count} batches over {plan.num_epochs} epoch(s), {plan.max_steps} optimizer updates, "
        f"{len(plan.validations())} validation point(s)\n"
        f"  manifest content address {manifest.content_address}"
        + (f"\n  written to {args.out} (it contains the training data)" if args.out else "")
    )
    return 0


def _demo(args: Any) -> int:
    from prefect_gliner2.flows.demo import demo_report, run_demo

    summary = run_demo(args.dir)
    print(_describe(summary))
    print(demo_report(summary["demo"]))
    return 0


def _evaluate(args: Any) -> int:
    import fsspec

    from prefect_gliner2.runtime.model_sources import check_model_source
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records

    check_model_source(args.model)
    for path in args.data:
        fs, local = fsspec.core.url_to_fs(path)
        if not fs.exists(local):
            raise UsageError(f"data {path!r} does not exist; pass a JSONL file of gold records (path or URL)")
    pairs = to_pairs(load_records(_one(args.data), what="evaluation").examples())
    if args.json_out and os.path.isdir(args.json_out):
        raise UsageError(f"--json {args.json_out!r} is a directory; pass a file path for the JSON report")
    report = _score_model(args.model, pairs, threshold=args.threshold, batch_size=args.batch_size)
    payload = {"model": args.model, "data": args.data, "threshold": args.threshold, **report.to_dict()}
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
    print(_report_table(payload))
    return 0


def _score_model(source: str, pairs: list[Any], *, threshold: float, batch_size: int) -> Any:
    from prefect_gliner2.session_core.evaluation import model_extractor, score_extraction

    model = _load_for_evaluation(source)
    return score_extraction(pairs, model_extractor(model, threshold=threshold, batch_size=batch_size))


def _load_for_evaluation(source: str) -> Any:
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.weights import load_exported_model

    directory = os.path.expanduser(source)
    if os.path.isdir(directory):
        if not os.path.isfile(os.path.join(directory, "config.json")):
            raise UsageError(
                f"--model {source!r} has no config.json: pass a directory written by export (or save_pretrained)"
            )
        return load_exported_model(directory)
    return load_model(source)


def _report_table(report: dict[str, Any]) -> str:
    """Per-label precision, recall, F1 and support, then the totals."""
    rows = [(r["kind"], r["label"], r) for r in report["per_label"]]
    width = max([len(f"{k}/{label}") for k, label, _ in rows] + [len("all (micro)")])
    head = f"{'label':<{width}}  precision  recall      F1  support"

    def line(name: str, row: dict[str, Any]) -> str:
        return f"{name:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:6.4f}  {row['support']:7d}"

    lines = [head, *(line(f"{k}/{label}", r) for k, label, r in rows), "-" * len(head)]
    lines.append(line("all (micro)", report["total"]))
    metrics = report["metrics"]
    lines.append(
        f"macro F1 {metrics['eval_macro_f1']:.4f} over {len(rows)} label(s); {report['records']} records, "
        f"threshold {report['threshold']}; tp {report['total']['tp']}, fp {report['total']['fp']}, "
        f"fn {report['total']['fn']}"
    )
    return "\n".join(lines)


class ProgressBar:
    """A one-line terminal progress bar fed by the run's progress listener (redrawn in place on a TTY)."""

    WIDTH = 28

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = ""
        self.loss: float | None = None

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind in ("start", "progress") and "batch_count" in data:
            self.loss = data.get("loss", self.loss)
            self._draw(data, final=False)
        elif kind == "validation" and data.get("metrics"):
            metrics = data["metrics"]
            scores = (
                f"F1 {metrics['eval_f1']:.4f} (P {metrics['eval_precision']:.4f}, R {metrics['eval_recall']:.4f}), "
                if "eval_f1" in metrics
                else ""
            )
            self._line(f"validation at step {metrics.get('step')}: {scores}eval_loss {metrics.get('eval_loss'):.6g}")
        elif kind == "checkpoint" and data.get("committed"):
            self._line(f"checkpoint {data.get('name')} committed")

    def _draw(self, data: dict[str, Any], *, final: bool) -> None:
        total = max(int(data["batch_count"]), 1)
        done = min(int(data["cursor"]), total)
        filled = self.WIDTH * done // total
        loss = f" · loss {self.loss:.4g}" if isinstance(self.loss, float) else ""
        text = (
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] batch {done}/{total} · step {data['step']}/"
            f"{data['max_steps']} · epoch {data['epoch'] + 1}/{data['num_epochs']}{loss}"
        )
        self.last = text
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()

    def _line(self, text: str) -> None:
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        if not self.tty and self.last:
            self.stream.write(self.last + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


def _describe(summary: dict[str, Any]) -> str:
    best = summary.get("best_metric")
    lines = [
        f"run {summary['run_key']}: {summary.get('total_steps')} steps, {summary.get('total_epochs')} epoch(s)"
        + (", stopped early" if summary.get("stopped_early") else ""),
        f"  model ({summary.get('label')} weights): {summary.get('export')}",
        f"  best {summary.get('metric_for_best')}: "
        + (f"{best:.4f} at step {summary.get('best_step')}" if best is not None else "n/a (no validation data)"),
        f"  checkpoints: {summary.get('checkpoints')} (newest {summary.get('checkpoint')})",
        f"  run directory: {summary.get('run_dir')}",
    ]
    if summary.get("flow_run_id"):
        lines.append(
            f"  Prefect flow run: {summary['flow_run_id']} (prefect flow-run inspect {summary['flow_run_id']})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
