"""A fresh start's first batch with and without memory already held: what a resumed worker's first batch pays.

    python bench/ballast.py [--arch span] [--gb 1.6] [--repeats 4] [--smoke]

A resumed worker holds the AdamW moments (and, mid-window, the pending gradients) before its first batch; a fresh
start allocates its moments only at its first optimizer update. On this project's VMs, whose host backs only a few
GB of a guest's memory cheaply (``bench/realsize.py``'s first-touch line), a resume's first batch came out slower
than a fresh start's while its load was done before it. This separates the memory from the restore: fresh
interpreters with the worker's environment (``worker_environment``: its memory setting) build the gliner2-base
shape and train one batch, half of them after allocating and touching `--gb` of ballast (1.6 GB: the span model's
AdamW moments, 2 x 213M float32), alternating which goes first. Nothing is restored in either. Printed: each run's
first batch and the time to touch the ballast, and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_process import ROOT, run_bench_script  # noqa: E402  (bench/fresh_process.py, beside this script)
from overlap import bench_config  # noqa: E402  (bench/overlap.py, beside this script)

from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model  # noqa: E402

_SCRIPT = """
import json, time, torch
torch.set_num_threads({threads})
from gliner2.auto import AutoExtractor
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
from prefect_gliner2.training.tiny import tiny_records
cfg = TrainingConfig.from_dict({config!r})
plan = ManagedTrainingPlan(tiny_records(16, seed=3), cfg, architecture={arch!r})
session = TrainingSession(AutoExtractor.from_pretrained({model!r}), cfg, max_steps=plan.max_steps, device="cpu")
started = time.perf_counter()
ballast = torch.ones({size}, dtype=torch.uint8) if {size} else None  # allocated and every page touched
touched = time.perf_counter() - started
started = time.perf_counter()
session.forward_backward(plan.batch(3))
print("BENCH " + json.dumps({{"touch": touched, "first_batch": time.perf_counter() - started}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="span", choices=["span", "boundary"])
    parser.add_argument("--gb", type=float, default=1.6, help="ballast held before the first batch, in GB (1e9 B)")
    parser.add_argument("--repeats", type=int, default=4, help="pairs of runs, the order alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a small model: checks the script")
    args = parser.parse_args()
    from prefect_gliner2.runtime.spawn import worker_environment

    shape = dict(GLINER2_BASE_SIZE)
    if args.smoke:
        shape.update(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=1000)
    with tempfile.TemporaryDirectory(prefix="ballast-", dir=os.environ.get("BENCH_TMP")) as tmp:
        model = save_tiny_model(Path(tmp) / f"model-{args.arch}", args.arch, seed=0, dropout=0.1, **shape)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **worker_environment())
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for repeat in range(args.repeats):
            for held in (False, True) if repeat % 2 == 0 else (True, False):
                script = _SCRIPT.format(
                    threads=args.threads,
                    config=bench_config(tmp, False).to_dict(),
                    arch=args.arch,
                    model=str(model),
                    size=int(args.gb * 1e9) if held else 0,
                )
                result = run_bench_script(script, env, "fresh start")
                runs[held].append(result)
                print(
                    f"{'with' if held else 'without':7} ballast: first batch {result['first_batch']:.2f} s"
                    + (f" (ballast touched in {result['touch']:.2f} s)" if held else ""),
                    flush=True,
                )
    print(
        f"{args.arch}, {args.threads} threads, ballast {args.gb:g} GB, {args.repeats} pairs; "
        "first batch, median (min-max):"
    )
    for held in (False, True):
        values = [r["first_batch"] for r in runs[held]]
        print(
            f"  {'with' if held else 'without':7} ballast  {statistics.median(values):.2f} "
            f"({min(values):.2f}-{max(values):.2f}) s"
        )
    ratio = statistics.median(r["first_batch"] for r in runs[True]) / statistics.median(
        r["first_batch"] for r in runs[False]
    )
    print(f"  with / without  {ratio:.2f}")


if __name__ == "__main__":
    main()
