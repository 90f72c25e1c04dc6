"""Training steps with and without the memory setting the flow gives its worker, side by side.

    python bench/memory.py                       # the ~1 s bench model and the gliner2-base shape (~6 minutes)
    python bench/memory.py --shapes 768x6 --steps 12 --repeat 2 --json out.json

The flow's worker starts with glibc's malloc thresholds raised (``prefect_gliner2.runtime.spawn.
worker_environment``): the blocks a step frees are reused by the next step instead of going back to the kernel and
being faulted in again, page by page. Here each run is a fresh interpreter that builds a session on the model and
trains ``--steps`` updates (forward_backward + optim_step, the session's public API; no Prefect); the
settings take turns, the order rotating, ``--repeat`` groups. Printed per shape, median (min-max) over the groups:

- step ms: the median update after the first two (warm-up), default / retaining, and their ratio;
- page faults per update (minor faults counted by the kernel), default / retaining;
- peak resident set (``VmHWM``), default / retaining: what keeping freed memory costs;
- the first update (fresh memory everywhere: the cost of a page the process has not touched), default / retaining;
- the weights after the last update, compared bitwise between every run (the setting must not change a bit).

``--thp`` adds a third run to every group, in the same rotation: the worker's setting plus PyTorch's own switch for
transparent huge pages on its CPU tensors (``THP_MEM_ALLOC_ENABLE=1``: allocations of 2 MiB and more aligned to 2
MiB and ``madvise(MADV_HUGEPAGE)``; it takes effect where the kernel's THP mode is ``madvise`` or ``always``). A
worker does not use it (docs/benchmarks.md, "Tried and not kept"); this measures why.
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
THP_SWITCH = "THP_MEM_ALLOC_ENABLE"  # PyTorch's (c10's CPU allocator): huge pages for CPU tensors of 2 MiB and more

_CHILD = """
import json, os, resource, statistics, sys, time
import torch
torch.set_num_threads({threads})
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
from prefect_gliner2.training.state import tensors_digest
from prefect_gliner2.training.tiny import tiny_records

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
    "step": statistics.median(steps[2:]), "faults": statistics.median(faults[2:]), "peak": peak, "first": steps[0],
    "weights": tensors_digest(list(session.model.state_dict().items())),
    "tunables": os.environ.get("GLIBC_TUNABLES"), "thp": os.environ.get({thp_switch!r}),
}}))
"""


def model_source(shape: str, tmp: str) -> str:
    if shape == "768x6":
        return "tiny:span:768x6"
    from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model

    return str(save_tiny_model(Path(tmp) / "base", "span", seed=0, dropout=0.1, **GLINER2_BASE_SIZE))


def one_run(model: str, steps: int, threads: int, variant: str, tmp: str) -> dict[str, Any]:
    """One fresh interpreter training `steps` updates; `variant` is "default" (glibc's defaults), "retain" (the
    worker's setting) or "thp" (the worker's setting and PyTorch's huge pages)."""
    from prefect_gliner2.runtime.spawn import ENV_WORKER_MEMORY, worker_environment

    drop = ("GLIBC_TUNABLES", ENV_WORKER_MEMORY, THP_SWITCH)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(ENV, PYTHONPATH=str(ROOT), **(worker_environment({}) if variant != "default" else {}))
    if variant == "thp":
        env[THP_SWITCH] = "1"
    script = _CHILD.format(threads=threads, out=str(Path(tmp) / "out"), steps=steps, model=model, thp_switch=THP_SWITCH)
    result = run_bench_script(script, env)
    if bool(result["tunables"]) != (variant != "default") or (result["thp"] == "1") != (variant == "thp"):
        raise SystemExit(f"the run's environment ({result['tunables']!r}, {result['thp']!r}) is not {variant!r}")
    return result


def spread(values: list[float], fmt: str) -> str:
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def bench_shape(shape: str, args: argparse.Namespace, threads: int, tmp: str) -> dict[str, Any]:
    model = model_source(shape, tmp)
    variants = ["default", "retain"] + (["thp"] if args.thp else [])
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for repeat in range(args.repeat):
        shift = repeat % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            runs[variant].append(one_run(model, args.steps, threads, variant, tmp))
        print(f"  {shape}: group {repeat + 1} done", file=sys.stderr, flush=True)
    digests = {r["weights"] for variant in runs.values() for r in variant}
    result = {
        "shape": shape,
        "model": model if shape != "base" else "gliner2-base shape",
        "runs": runs,
        "ratio": [r["step"] / d["step"] for r, d in zip(runs["retain"], runs["default"], strict=True)],
        "same_bits": len(digests) == 1,
    }
    if args.thp:
        pairs = list(zip(runs["thp"], runs["retain"], strict=True))
        result["thp_ratio"] = [t["step"] / r["step"] for t, r in pairs]
        result["thp_first_ratio"] = [t["first"] / r["first"] for t, r in pairs]
    return result


def report(result: dict[str, Any]) -> list[str]:
    variants = list(result["runs"])

    def each(key: str, scale: float, fmt: str) -> str:
        columns = [spread([r[key] * scale for r in result["runs"][v]], fmt) for v in variants]
        return f"{columns[0]:>22} / " + " / ".join(columns[1:])

    names = " / ".join({"default": "default", "retain": "retaining", "thp": "retaining + THP"}[v] for v in variants)
    lines = [
        f"{result['shape']} ({result['model']}), {names}:",
        f"  step ms                                {each('step', 1e3, '.1f')}",
        f"  retaining / default, step              {spread(result['ratio'], '.3f'):>22}",
        f"  first update ms                        {each('first', 1e3, '.0f')}",
        f"  page faults per update                 {each('faults', 1, '.0f')}",
        f"  peak RSS MB                            {each('peak', 1 / 2**20, '.0f')}",
    ]
    if "thp_ratio" in result:
        lines += [
            f"  retaining + THP / retaining, step      {spread(result['thp_ratio'], '.3f'):>22}",
            f"  retaining + THP / retaining, first     {spread(result['thp_first_ratio'], '.3f'):>22}",
        ]
    lines.append(
        f"  weights after the last update          {'bitwise equal in every run' if result['same_bits'] else 'DIFFER'}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=12, help="updates per run (the first two are warm-up)")
    parser.add_argument("--repeat", type=int, default=2, help="groups of runs (default, retaining), order rotating")
    parser.add_argument("--thp", action="store_true", help="add a run with PyTorch's huge pages to every group")
    parser.add_argument("--threads", type=int, help="torch threads (default: the flow's default)")
    parser.add_argument("--json", help="also write the runs and figures as JSON to this file")
    args = parser.parse_args()
    from prefect_gliner2.runtime.resources import default_cpu_threads

    threads = args.threads or default_cpu_threads()
    print(
        f"training updates with glibc's default malloc and with the worker's memory setting, {threads} thread(s), "
        f"{args.steps} updates per run, median (min-max) of {args.repeat} group(s)"
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
