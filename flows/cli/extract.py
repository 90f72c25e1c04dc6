"""``prefect-gliner2 extract``: a model's extractions for every text of a JSONL file, batched, with the model's
fitted thresholds, long texts split with gliner2's own chunking, and resumable: the same command after a kill
continues where it stopped (see runtime/extract.py for the job's files and guarantees). ``--format label-studio``
(or spacy, conll, doccano, spacy-jsonl) writes the predictions for review in that tool (runtime/extract_formats.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefect_gliner2.flows.cli.args import positive, threshold
from prefect_gliner2.session_core.onnx_scope import PRECISIONS, RUNTIME_TORCH, RUNTIMES

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "extract", help="extract entities (or any gliner2 schema) from a JSONL file of texts, resumably"
    )
    parser.add_argument(
        "--model",
        required=True,
        help="an export or gliner2 model directory, a registry model ROOT/NAME (its CURRENT version) or "
        "ROOT/NAME@v000002, a Hugging Face id or tiny:span; any fsspec URL",
    )
    parser.add_argument("--data", required=True, help='JSONL of records {"text": ..., optional "labels"/"schema"/"id"}')
    parser.add_argument("--out", required=True, help="output path or URL (published whole at the end)")
    parser.add_argument(
        "--format",
        dest="output_format",
        choices=("jsonl", "label-studio", "spacy", "conll", "doccano", "spacy-jsonl"),
        default="jsonl",
        help="jsonl (default: one extraction per line), or an annotation format for review in a tool: label-studio "
        "(pre-annotations with scores and the model version), spacy (DocBin), conll, doccano, spacy-jsonl; the "
        "corrections come back with `prefect-gliner2 convert`",
    )
    parser.add_argument(
        "--labels",
        type=_labels,
        help="entity labels for records without their own 'labels'/'schema', comma-separated (default: the labels "
        "the model records, if any)",
    )
    parser.add_argument(
        "--threshold", type=threshold, help="one threshold in [0, 1] for every label (default: the model's fitted ones)"
    )
    parser.add_argument("--batch-size", type=positive, default=8, help="texts per inference batch (default 8)")
    parser.add_argument("--chunk-records", type=positive, default=256, help="records per resumable chunk (default 256)")
    parser.add_argument(
        "--chunk-size", type=positive, default=384, help="longer texts (in words) are split into windows (default 384)"
    )
    parser.add_argument("--chunk-overlap", type=int, default=64, help="words shared by adjacent windows (default 64)")
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=RUNTIME_TORCH,
        help="torch: gliner2 on the torch model (default); onnx: the model's ONNX export through gliner2-onnx "
        "(prefect-gliner2 export --format onnx; --model names the export, or a model or registry version that has one)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the ONNX export's precision to run (default: its first of fp32, int8, fp16); only with --runtime onnx",
    )
    parser.set_defaults(handler=run)


def _labels(text: str) -> list[str]:
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise argparse.ArgumentTypeError(f"expected comma-separated labels such as person,organization, got {text!r}")
    return labels


def run(args: Any) -> int:
    from prefect_gliner2.flows.cli.progress import RecordBar
    from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job, run_job

    settings = ExtractSettings(
        labels=args.labels,
        threshold=args.threshold,
        batch_size=args.batch_size,
        records_per_chunk=args.chunk_records,
        chunk_size=args.chunk_size,
        chunk_overlap=args.chunk_overlap,
        output_format=args.output_format,
        runtime=args.runtime,
        precision=args.precision,
    )
    job = prepare_job(args.model, args.data, args.out, settings)
    onnx = f" (ONNX {job.settings.precision}: {job.model.uri})" if job.settings.runtime != RUNTIME_TORCH else ""
    print(
        f"extracting {job.input.records} record(s) of {args.data} with {job.model.describe()}{onnx}; threshold "
        f"{job.threshold_source}",
        file=sys.stderr,
    )
    bar = RecordBar(sys.stderr, job.input.records)
    chunked = [0]

    def progress(info: dict[str, Any], done: int) -> None:
        if info["reused"]:
            bar.reused += int(info["records"])
        chunked[0] += int(info["texts_chunked"])
        bar.update(done, f"{chunked[0]} long text(s) chunked" if chunked[0] else "")

    try:
        summary = run_job(job, progress)
    finally:
        bar.close()
    print(describe(summary))
    return 0


def describe(summary: dict[str, Any]) -> str:
    """What was extracted, where it is, how long texts were handled, and what an earlier run had done."""
    fmt = summary.get("format", "jsonl")
    what = "line(s)" if fmt == "jsonl" else f"record(s) as {fmt}"
    lines = [f"wrote {summary['records']} {what} to {summary['out']}"]
    if summary.get("already_committed"):
        lines[0] += " (already complete: nothing to do)"
    elif summary["reused"]:
        lines.append(f"  resumed: {summary['reused']} of {summary['chunks']} chunk(s) were done by an earlier run")
    if summary["texts_chunked"]:
        lines.append(
            f"  {summary['texts_chunked']} text(s) longer than {summary['chunk_size']} words were split into "
            f"{summary['text_chunks']} overlapping windows (gliner2's batch_extract_long, overlap "
            f"{summary['chunk_overlap']}) and merged; nothing was truncated"
        )
    else:
        lines.append(f"  no text was longer than {summary['chunk_size']} words: none was split")
    version = f" version {summary['version']}" if summary.get("version") else ""
    onnx = f" (ONNX export, {summary['precision']})" if summary.get("runtime", RUNTIME_TORCH) != RUNTIME_TORCH else ""
    lines.append(f"  model {summary['model']}{version}{onnx}; threshold {summary['threshold_source']}")
    return "\n".join(lines)
