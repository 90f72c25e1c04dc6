"""Flow overhead, measured side by side: the same plan run (a) directly with ManagedTraining in one process,
(b) through the training flow with one Prefect task per batch, (b2) per-batch tasks with pipelined submission, and
(c) with grouped batches + pipelining. Prints wall times and the ratios to (a).

    python bench/flow.py            # tiny model (hidden 32) and a ~100 ms/step model (tiny:span:256x2)
    python bench/flow.py --quick    # smaller plans, for a smoke test
    python bench/flow.py --quick --device cuda [--bf16]   # the same comparison on a GPU (bench/gpu.sh)

Every variant pays its own start-up: (a) is a fresh interpreter that imports torch, builds the model, trains and
exports; (b), (b2) and (c) are `train_flow` calls (the worker process imports torch, builds, restores, trains,
checkpoints at epoch ends, exports), each against a fresh local Prefect server (SQLite) that is already up, with
Prefect's default settings (flow-run heartbeats on). Torch uses the same thread count everywhere.
Targets: b/a <= 1.10 at ~100 ms steps, c/a <= 1.10 at tiny steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES: list[dict[str, Any]] = [
    {
        "name": "tiny (hidden 32)",
        "model": "tiny:span",
        "records": 2400,
        "quick_records": 240,
        "grouped": {"batches_per_task": 32, "pipeline_depth": 2},
    },
    {
        "name": "~100 ms/step (256x2)",
        "model": "tiny:span:256x2",
        "records": 400,
        "quick_records": 80,
        "grouped": {"batches_per_task": 4, "pipeline_depth": 2},
    },
]
DEVICE = "cpu"
CONFIG = {
    "fp16": False,
    "bf16": False,
    "batch_size": 4,
    "num_epochs": 2,
    "eval_strategy": "epoch",
    "seed": 3,
    "encoder_lr": 1e-4,
    "task_lr": 1e-3,
}

_DIRECT = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads({threads})
from prefect_gliner2.session_core import ManagedTraining, ManagedTrainingPlan, TrainingSession
from prefect_gliner2.runtime.model_sources import load_model
loaded = ManagedTrainingPlan.from_manifest({manifest!r})
session = TrainingSession(load_model({model!r}), loaded.plan.config, max_steps=loaded.plan.max_steps, device={device!r})
run = ManagedTraining(session, loaded.plan, eval_examples=loaded.eval_examples or None)
started = time.perf_counter()
run.run()
run.export_weights({export!r}, which="best")
print(json.dumps({{"train_and_export": time.perf_counter() - started}}))
"""


def write_inputs(directory: Path, n_train: int) -> dict[str, str]:
    from prefect_gliner2.session_core.tiny import tiny_records

    directory.mkdir(parents=True, exist_ok=True)
    paths = {"train": str(directory / "train.jsonl"), "valid": str(directory / "valid.jsonl")}
    for key, records in (("train", tiny_records(n_train, seed=1)), ("valid", tiny_records(8, seed=2))):
        Path(paths[key]).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return paths


def run_direct(case: dict[str, Any], inputs: dict[str, str], work: Path, threads: int, key: str) -> float:
    """(a): a fresh interpreter training the plan with ManagedTraining; wall time of the whole process."""
    from prefect_gliner2.runtime.model_sources import model_architecture
    from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
    from prefect_gliner2.session_core.manifest import write_manifest

    plan = ManagedTrainingPlan(
        inputs["train"], TrainingConfig.from_dict(CONFIG), architecture=model_architecture(case["model"])
    )
    manifest = str(work / f"direct-manifest-{key}.json")
    write_manifest(plan.manifest_bytes(inputs["valid"]), manifest)
    script = _DIRECT.format(
        root=str(ROOT),
        threads=threads,
        manifest=manifest,
        model=case["model"],
        export=str(work / f"direct-export-{key}"),
        device=DEVICE,
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"direct run failed:\n{done.stderr[-3000:]}")
    return elapsed


def run_flow(case: dict[str, Any], inputs: dict[str, str], work: Path, key: str, threads: int, **options: Any) -> float:
    """A flow variant against its own fresh, idle Prefect server (started before the clock starts): a server
    still ingesting the previous variant's task-run events would slow this one down."""
    from prefect.testing.utilities import prefect_test_harness

    from prefect_gliner2.flows.train import train_flow

    with prefect_test_harness(server_startup_timeout=120):
        started = time.perf_counter()
        train_flow(
            model=case["model"],
            train_data=inputs["train"],
            valid_data=inputs["valid"],
            config=CONFIG,
            run_key=key,
            storage=str(work / "runs"),
            checkpointing={"checkpoint_every": 0},
            execution={"cpu_threads": threads, "device": DEVICE},
            **options,
        )
        return time.perf_counter() - started


def bench_case(case: dict[str, Any], work: Path, *, quick: bool, threads: int, repeat: int) -> dict[str, Any]:
    """Each variant `repeat` times, interleaved (a, b, b2, c, a, b, ...); the minimum of each is reported."""
    n = case["quick_records"] if quick else case["records"]
    inputs = write_inputs(work / "data", n)
    batches = 2 * ((n + CONFIG["batch_size"] - 1) // CONFIG["batch_size"])
    times: dict[str, list[float]] = {"a": [], "b": [], "b2": [], "c": []}
    for r in range(repeat):
        times["a"].append(run_direct(case, inputs, work, threads, str(r)))
        times["b"].append(run_flow(case, inputs, work, f"per-batch-{r}", threads))
        times["b2"].append(run_flow(case, inputs, work, f"per-batch-pipelined-{r}", threads, pipeline_depth=2))
        times["c"].append(run_flow(case, inputs, work, f"grouped-{r}", threads, **case["grouped"]))
    return {
        "case": case["name"],
        "batches": batches,
        **{k: min(v) for k, v in times.items()},
        "all": times,
        "grouped": case["grouped"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller plans (smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every variant (default 1)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each variant; the minimum is reported")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (every variant trains there)")
    parser.add_argument("--bf16", action="store_true", help="bf16 (CUDA with native bf16 only)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    CONFIG["bf16"] = bool(args.bf16)
    print(f"device {DEVICE}, {'bf16' if args.bf16 else 'fp32'}, {args.threads} torch thread(s)")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
        for index, case in enumerate(CASES):
            rows.append(
                bench_case(case, Path(tmp) / f"case{index}", quick=args.quick, threads=args.threads, repeat=args.repeat)
            )
            _print(rows[-1:], header=index == 0)
    print(
        "\nb: one task per batch; b2: one task per batch, pipeline_depth=2; c: grouped + pipelined "
        "(batches_per_task/pipeline_depth per case as shown); all include start-up, checkpoints and export.\n"
        f"minimum of {args.repeat} interleaved run(s) each; all runs: "
        + "; ".join(
            f"{r['case']}: " + ", ".join(f"{k} {' '.join(f'{t:.2f}' for t in v)}" for k, v in r["all"].items())
            for r in rows
        )
    )


def _print(rows: list[dict[str, Any]], *, header: bool) -> None:
    if header:
        print(
            f"{'case':<22}{'batches':>8}{'(a) direct':>12}{'(b) tasks':>11}{'(b2) pipe':>11}{'(c) group':>11}"
            f"{'b/a':>7}{'b2/a':>7}{'c/a':>7}  c options"
        )
    for r in rows:
        print(
            f"{r['case']:<22}{r['batches']:>8}{r['a']:>11.2f}s{r['b']:>10.2f}s{r['b2']:>10.2f}s{r['c']:>10.2f}s"
            f"{r['b'] / r['a']:>7.2f}{r['b2'] / r['a']:>7.2f}{r['c'] / r['a']:>7.2f}  "
            f"{r['grouped']['batches_per_task']}/task, depth {r['grouped']['pipeline_depth']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
