"""Training steps with and without the memory setting the flow gives its worker, side by side.

    python bench/memory.py                       # the ~1 s bench model and the gliner2-base shape (~6 minutes)
    python bench/memory.py --shapes 768x6 --steps 12 --repeat 2 --json out.json

The flow's worker starts with glibc's malloc thresholds raised (``prefect_gliner2.runtime.spawn.
worker_environment``): the blocks a step frees are reused by the next step instead of going back to the kernel and
being faulted in again, page by page. Here each run is a fresh interpreter that builds a session on the model and
trains ``--steps`` updates (forward_backward + optim_step, the session's public API; no Prefect); the two
settings alternate, ``--repeat`` pairs. Printed per shape, median (min-max) over the pairs:

- step ms: the median update after the first two (warm-up), default / retaining, and their ratio;
- page faults per update (minor faults counted by the kernel), default / retaining;
- peak resident set (``VmHWM``), default / retaining: what keeping freed memory costs;
- the weights after the last update, compared bitwise between every run (the setting must not change a bit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fresh_process import run_bench_script  # noqa: E402  (bench/fresh_process.py, beside this script)

SHAPES = ("768x6", "base")  # bench/flow.py's ~1 s model; the gliner2-base shape (GLINER2_BASE_SIZE), built in code
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}

_CHILD = """
import json, os, resource, statistics, sys, time
import torch
torch.set_num_threads({threads})
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, TrainingSession
from prefect_gliner2.session_core.state import tensors_digest
from prefect_gliner2.session_core.tiny import tiny_records

config = TrainingConfig.from_dict({{"batch_size": 4, "gradient_accumulation_steps": 1, "num_epochs": 1, "seed": 3,
                                    "fp16": False, "bf16": False, "output_dir": {out!r}}})
plan = ManagedTrainingPlan(tiny_records(4 * {steps} + 8, seed=1), config, architecture="span")
session = TrainingSession(load_model({model!r}), config, max_steps=plan.max_steps, device="cpu")
steps, faults = [], []
for index in range({steps}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    session.forward_backward(plan.batch(index))
    session.optim_step()
    steps.append(time.perf_counter() - started)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
print("BENCH " + json.dumps({{
    "step": statistics.median(steps[2:]), "faults": statistics.median(faults[2:]), "peak": peak,
    "weights": tensors_digest(list(session.model.state_dict().items())),
    "tunables": os.environ.get("GLIBC_TUNABLES"),
}}))
"""


def model_source(shape: str, tmp: str) -> str:
    if shape == "768x6":
        return "tiny:span:768x6"
    from prefect_gliner2.session_core.tiny import GLINER2_BASE_SIZE, save_tiny_model

    return str(save_tiny_model(Path(tmp) / "base", "span", seed=0, dropout=0.1, **GLINER2_BASE_SIZE))


def one_run(model: str, steps: int, threads: int, retain: bool, tmp: str) -> dict[str, Any]:
    from prefect_gliner2.runtime.spawn import ENV_WORKER_MEMORY, worker_environment

    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", ENV_WORKER_MEMORY)}
    env.update(ENV, PYTHONPATH=str(ROOT), **(worker_environment({}) if retain else {}))
    script = _CHILD.format(threads=threads, out=str(Path(tmp) / "out"), steps=steps, model=model)
    result = run_bench_script(script, env)
    if bool(result["tunables"]) != retain:
        raise SystemExit(f"the run's GLIBC_TUNABLES is {result['tunables']!r}, expected the setting {retain}")
    return result


def spread(values: list[float], fmt: str) -> str:
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def bench_shape(shape: str, args: argparse.Namespace, threads: int, tmp: str) -> dict[str, Any]:
    model = model_source(shape, tmp)
    runs: dict[str, list[dict[str, Any]]] = {"default": [], "retain": []}
    for repeat in range(args.repeat):
        order = ("default", "retain") if repeat % 2 == 0 else ("retain", "default")
        for variant in order:
            runs[variant].append(one_run(model, args.steps, threads, variant == "retain", tmp))
        print(f"  {shape}: pair {repeat + 1} done", file=sys.stderr, flush=True)
    ratios = [r["step"] / d["step"] for r, d in zip(runs["retain"], runs["default"], strict=True)]
    digests = {r["weights"] for variant in runs.values() for r in variant}
    return {
        "shape": shape,
        "model": model if shape != "base" else "gliner2-base shape",
        "runs": runs,
        "ratio": ratios,
        "same_bits": len(digests) == 1,
    }


def report(result: dict[str, Any]) -> list[str]:
    def both(key: str, scale: float, fmt: str) -> str:
        default, retain = ([r[key] * scale for r in result["runs"][v]] for v in ("default", "retain"))
        return f"{spread(default, fmt):>22} / {spread(retain, fmt)}"

    return [
        f"{result['shape']} ({result['model']}):",
        f"  step ms, default / retaining           {both('step', 1e3, '.1f')}",
        f"  retaining / default, step              {spread(result['ratio'], '.3f'):>22}",
        f"  page faults per update                 {both('faults', 1, '.0f')}",
        f"  peak RSS MB                            {both('peak', 1 / 2**20, '.0f')}",
        f"  weights after the last update          {'bitwise equal in every run' if result['same_bits'] else 'DIFFER'}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=12, help="updates per run (the first two are warm-up)")
    parser.add_argument("--repeat", type=int, default=2, help="pairs of runs (default, retaining), order alternating")
    parser.add_argument("--threads", type=int, help="torch threads (default: the flow's default)")
    parser.add_argument("--json", help="also write the runs and figures as JSON to this file")
    args = parser.parse_args()
    from prefect_gliner2.runtime.resources import default_cpu_threads

    threads = args.threads or default_cpu_threads()
    print(
        f"training updates with glibc's default malloc and with the worker's memory setting, {threads} thread(s), "
        f"{args.steps} updates per run, median (min-max) of {args.repeat} pair(s)"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=os.environ.get("BENCH_TMP")) as tmp:
        for shape in args.shapes.split(","):
            results.append(bench_shape(shape, args, threads, tmp))
            print("\n".join(report(results[-1])), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not all(r["same_bits"] for r in results):
        raise SystemExit("the memory setting changed the trained weights")


if __name__ == "__main__":
    main()
