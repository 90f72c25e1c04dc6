"""Benchmark: extraction throughput of the resumable core (what ``prefect-gliner2 extract`` and the gliner2-extract
flow's tasks run) against a plain gliner2 ``batch_extract`` over the same texts, and what a kill and resume costs.

Usage: python bench/extract.py [--model tiny:span:128x2] [--records 2000] [--repeats 3] [--no-kill]
       python bench/extract.py --onnx-only --records 500 --repeats 3 --threads 2     # the ONNX rows alone

Throughput: the same loaded model, the same texts, labels, threshold and batch size. "plain" is one
``model.batch_extract(texts, schema, batch_size=B)`` over texts already in memory; "core" is
``runtime.extract.prepare_job`` + ``run_job`` from the JSONL file (reading, checking and hashing the input, chunk
parts written and committed, the output published), the model loaded before the clock starts. Runs alternate;
medians are compared (ratio = plain seconds / core seconds: 1.0 means no overhead), in wall seconds and in this
process's CPU seconds (with one torch thread, CPU time barely moves with other load on the machine).

Kill + resume: the CLI as a real process, uninterrupted, against the same command SIGKILLed when it is about to
compute the middle chunk (a fault-plan pause; tests/support/faultsite) and run again: the cost is the two runs'
seconds minus the uninterrupted run's (a second process start and model load, and at most the chunk in flight).

ONNX rows (``--onnx``; ``--onnx-only`` runs nothing else; ``bench/extract_onnx.py``): a span model on the real MiniLM
encoder (``init-model``, then a short training run in this process: 36 updates; built once, cached) exported to
ONNX (fp32, int8) behind the parity gate; records per second of gliner2's ``batch_extract`` on the torch model
against the ONNX export through the gliner2-onnx runtime (``runtime/onnx_extract.py``, what ``extract --runtime
onnx`` runs), on the same texts, labels, fitted thresholds and thread count (torch threads = ONNX Runtime intra-op
threads); the micro F1 of each against the texts' gold beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FAULT_SITE = ROOT / "tests" / "support" / "faultsite"


def _inputs(folder: Path, records: int) -> tuple[str, list[str], list[str]]:
    from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES, tiny_records

    texts = [record["input"] for record in tiny_records(records, seed=11)]
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps({"text": text, "id": i}) + "\n" for i, text in enumerate(texts)))
    return str(path), texts, list(TINY_ENTITY_TYPES)


def _throughput(model: str, data: str, texts: list[str], labels: list[str], args: argparse.Namespace) -> dict:
    import torch
    from gliner2.inference.schema import Schema

    from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job, run_job

    torch.set_num_threads(args.threads)
    settings = ExtractSettings(labels=labels, batch_size=args.batch_size, records_per_chunk=args.chunk_records)
    folder = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    warm = prepare_job(model, data, str(folder / "warm.jsonl"), settings)
    loaded = warm.extractor()  # the model, loaded once (the core reuses it: runtime.extract_model.loaded_extractor)
    schema = Schema.from_dict({"entities": labels})
    plain: list[tuple[float, float]] = []
    core: list[tuple[float, float]] = []
    for repeat in range(args.repeats + 1):  # the first round warms both paths and is dropped
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            expected = loaded.model.batch_extract(texts, schema, batch_size=args.batch_size, threshold=0.5)
        plain_seconds = (time.perf_counter() - wall, time.process_time() - cpu)
        out = folder / f"out-{repeat}.jsonl"
        wall, cpu = time.perf_counter(), time.process_time()
        summary = run_job(prepare_job(model, data, str(out), settings))
        core_seconds = (time.perf_counter() - wall, time.process_time() - cpu)
        got = [json.loads(line)["extraction"] for line in out.read_text().splitlines()]
        assert got == expected and summary["records"] == len(texts), "the core's output differs from batch_extract"
        if repeat:
            plain.append(plain_seconds)
            core.append(core_seconds)
    report: dict = {"plain_s": plain, "core_s": core}
    for i, kind in enumerate(("wall", "cpu")):
        p, c = statistics.median(x[i] for x in plain), statistics.median(x[i] for x in core)
        report[kind] = {"plain_median_s": p, "core_median_s": c, "ratio": p / c}
    return report


def _cli(model: str, data: str, out: str, labels: list[str], args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "prefect_gliner2.flows.cli", "extract", "--model", model, "--data", data]
    command += ["--out", out, "--labels", ",".join(labels), "--batch-size", str(args.batch_size)]
    return command + ["--chunk-records", str(args.chunk_records)]


def _kill_resume(model: str, data: str, labels: list[str], records: int, args: argparse.Namespace) -> dict:
    from prefect_gliner2.runtime.faults import Fault, FaultPlan

    folder = Path(tempfile.mkdtemp(prefix="bench-extract-kill-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAULT_SITE), str(ROOT)]), OMP_NUM_THREADS=str(args.threads))
    start = time.perf_counter()
    full_command = _cli(model, data, str(folder / "full.jsonl"), labels, args)
    subprocess.run(full_command, env=env, check=True, capture_output=True)
    full = time.perf_counter() - start
    middle = (records // args.chunk_records + 1) // 2
    markers = folder / "markers"
    markers.mkdir()
    plan = FaultPlan((Fault.pause("chunk", middle, 600),), markers=str(markers))
    command = _cli(model, data, str(folder / "killed.jsonl"), labels, args)
    start = time.perf_counter()
    process = subprocess.Popen(command, env={**env, "SUPPORT_FAULT_PLAN": plan.to_json()}, stderr=subprocess.DEVNULL)
    while not (markers / f"chunk-{middle}").exists():
        if process.poll() is not None:
            raise RuntimeError(f"the CLI exited ({process.returncode}) before chunk {middle}")
        time.sleep(0.01)
    process.kill()
    process.wait()
    killed = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    resumed = time.perf_counter() - start
    same = (folder / "full.jsonl").read_bytes() == (folder / "killed.jsonl").read_bytes()
    return {
        "uninterrupted_s": full,
        "killed_after_s": killed,
        "resume_s": resumed,
        "cost_s": killed + resumed - full,
        "killed_before_chunk": middle,
        "outputs_equal": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="tiny:span:128x2")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chunk-records", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-kill", action="store_true", help="skip the kill + resume measurement")
    parser.add_argument("--onnx", action="store_true", help="add the ONNX rows (a MiniLM span model, fp32 and int8)")
    parser.add_argument("--onnx-only", action="store_true", help="the ONNX rows alone")
    args = parser.parse_args()
    if args.onnx or args.onnx_only:
        from extract_onnx import onnx_rows

        print(json.dumps({"onnx": onnx_rows(args.records, args.repeats, args.threads, args.batch_size)}))
        if args.onnx_only:
            return
    folder = Path(tempfile.mkdtemp(prefix="bench-extract-data-"))
    data, texts, labels = _inputs(folder, args.records)
    report = {"model": args.model, "records": args.records, "batch_size": args.batch_size, "threads": args.threads}
    report["throughput"] = _throughput(args.model, data, texts, labels, args)
    t = report["throughput"]
    print(f"{args.records} texts, {args.model}, batch {args.batch_size}, {args.threads} thread(s), {args.repeats} runs")
    for kind in ("wall", "cpu"):
        p, c = t[kind]["plain_median_s"], t[kind]["core_median_s"]
        column = int(kind == "cpu")
        runs = [(round(a[column], 2), round(b[column], 2)) for a, b in zip(t["plain_s"], t["core_s"], strict=True)]
        print(
            f"  {kind:4} plain batch_extract {p:.2f} s ({args.records / p:.0f} texts/s), core {c:.2f} s "
            f"({args.records / c:.0f} texts/s): throughput ratio {t[kind]['ratio']:.3f} (pairs {runs})"
        )
    if not args.no_kill:
        k = report["kill_resume"] = _kill_resume(args.model, data, labels, args.records, args)
        print(
            f"CLI uninterrupted {k['uninterrupted_s']:.1f} s; killed before chunk {k['killed_before_chunk']} after "
            f"{k['killed_after_s']:.1f} s, resumed in {k['resume_s']:.1f} s: a kill + resume costs "
            f"{k['cost_s']:.1f} s; outputs equal: {k['outputs_equal']}"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
