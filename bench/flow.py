"""The training flow with its default settings against gliner2's own ``ExtractorTrainer.train()`` on the same plan:
wall-time ratios, the cost per batch (the slope over two run lengths) and the fixed costs, each with its spread.

    python bench/flow.py                 # tiny (~15 ms), ~100 ms and ~1 s steps; runs of ~2 minutes (about 40 min)
    python bench/flow.py --quick         # short runs, one repeat: checks the script (a few minutes)
    python bench/flow.py --cases tiny --minutes 3 --repeat 3 --json out.json

What is compared, per case, in fresh interpreters that each import, build the model, train and exit (wall time from
launch to exit):

- native: gliner2's ``ExtractorTrainer(model, config).train(records)``, the same config (the session's
  ``to_native_kwargs``), with its default saving (validation is off, so only its final model is saved);
- flow: ``train_flow(...)`` with default settings (automatic task grain and pipelining, checkpoints every 100
  updates and at the epoch end, keep 3, export) against a local Prefect server (SQLite) that is already up and idle
  (a fresh one per flow run, started before the clock starts: a user's running server, not the CLI's embedded one).

Same data (``tiny_records``), config (batch 4, one epoch, seed 3), thread count (``--threads``, default the flow's
own default: this machine's usable CPUs) and model (the built-in ``tiny:span`` shapes). Validation is off in both
(like with like: native validation computes a loss only, the flow's also extracts and scores). Each case runs two
plan lengths (``L`` batches, about ``--minutes`` of native training, and ``L/2``), interleaved native/flow,
``--repeat`` times. Printed per case, as median (min-max) over the repeats:

- ratio: flow wall time / native wall time at each length (target <= 1.05 for runs of a few minutes);
- per batch: the slope (T(L) - T(L/2)) / (L/2) of each, and flow/native (what each further batch costs; target
  <= 1.05), with the fixed cost T(L/2) - slope * L/2 of each;
- first batch: launch to the first batch trained (native: its first optimizer step returned; flow: the first
  training task's result reached the flow); target: the flow at most ``FIRST_BATCH_EXTRA_S`` after native;
- last batch to exit: the last batch trained to the process's exit (checkpoint, export, final report); target
  <= ``LAST_TO_EXIT_S`` for the flow.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # support.prefect_harness: a throwaway local Prefect server

CASES: dict[str, dict[str, Any]] = {
    "tiny": {"name": "tiny (~15 ms/step)", "model": "tiny:span"},
    "100ms": {"name": "~100 ms/step", "model": "tiny:span:256x2"},
    "1s": {"name": "~1 s/step", "model": "tiny:span:768x6"},
}
CONFIG: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "batch_size": 4,
    "gradient_accumulation_steps": 1,
    "num_epochs": 1,
    "eval_strategy": "no",
    "save_best": False,
    "seed": 3,
    "encoder_lr": 1e-4,
    "task_lr": 1e-3,
}
DEVICE: str | None = None  # the flow's execution device (native gliner2 takes CUDA whenever there is one)
RATIO_TARGET = 1.05
FIRST_BATCH_EXTRA_S = 4.0
LAST_TO_EXIT_S = 3.0
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "PREFECT_LOGGING_LEVEL": "WARNING"}

_NATIVE = """
import json, sys, time
import torch
torch.set_num_threads({threads})
from gliner2.training.trainer import ExtractorTrainer, TrainingConfig as NativeConfig
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.session_core import TrainingConfig
with open({data!r}, encoding="utf-8") as handle:
    records = [json.loads(line) for line in handle]
kwargs = TrainingConfig.from_dict({config!r}).to_native_kwargs()
kwargs.update(output_dir={out!r}, fp16=False, pin_memory=False, report_to_wandb=False, num_workers=0)
trainer = ExtractorTrainer(load_model({model!r}), NativeConfig(**kwargs))
marks = {{}}
step = trainer._optimizer_step
def timed(*args, **kwargs):
    result = step(*args, **kwargs)
    now = time.time()
    marks.setdefault("first", now)
    marks["last"] = now
    return result
trainer._optimizer_step = timed
trainer.train(train_data=records)
print("BENCH " + json.dumps(marks))
"""

_FLOW = """
import json, time
from prefect_gliner2.flows.reporting import add_listener
marks = {{}}
def listen(kind, data):
    if kind == "progress":
        now = time.time()
        marks.setdefault("first", now)
        if data.get("cursor", 0) >= data.get("batch_count", 1):
            marks["last"] = now
add_listener(listen)
from prefect_gliner2.flows.train import train_flow
train_flow(model={model!r}, train_data={data!r}, config={config!r}, run_key={key!r}, storage={storage!r},
           execution={{"cpu_threads": {threads}, "device": {device!r}}})
print("BENCH " + json.dumps(marks))
"""


def step_seconds(model: str, threads: int, work: Path) -> float:
    """The native step time of `model`, measured in this process (median of 6 steps after 2 warm-ups)."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, TrainingSession
    from prefect_gliner2.session_core.tiny import tiny_records

    torch.set_num_threads(threads)
    config = TrainingConfig.from_dict({**CONFIG, "output_dir": str(work / "calibrate")})
    plan = ManagedTrainingPlan(tiny_records(40, seed=1), config, architecture="span")
    session = TrainingSession(load_model(model), config, max_steps=plan.max_steps, device=DEVICE)
    times = []
    for i in range(8):
        started = time.perf_counter()
        session.forward_backward(plan.batch(i))
        session.optim_step()
        times.append(time.perf_counter() - started)
    session.close()
    return statistics.median(times[2:])


def write_data(path: Path, batches: int) -> str:
    from prefect_gliner2.session_core.tiny import tiny_records

    records = tiny_records(batches * CONFIG["batch_size"], seed=1)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def launch(script: str, env: dict[str, str]) -> dict[str, float]:
    """Run `script` in a fresh interpreter; wall time launch -> exit, and its first/last batch marks."""
    started = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    ended = time.time()
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"benchmark run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    marks = json.loads(line[6:])
    return {"total": ended - started, "first": marks["first"] - started, "tail": ended - marks["last"]}


def native_run(model: str, data: str, threads: int, work: Path) -> dict[str, float]:
    out = tempfile.mkdtemp(prefix="native-", dir=work)
    script = _NATIVE.format(threads=threads, data=data, config=CONFIG, out=out, model=model)
    return launch(script, dict(os.environ, PYTHONPATH=str(ROOT), **ENV))


def flow_run(model: str, data: str, threads: int, work: Path, key: str) -> dict[str, float]:
    from support.prefect_harness import local_prefect_server

    with local_prefect_server() as api:  # up and idle before the clock starts
        script = _FLOW.format(
            model=model, data=data, config=CONFIG, key=key, storage=str(work / "runs"), threads=threads, device=DEVICE
        )
        return launch(script, dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=api, **ENV))


def bench_case(case: dict[str, Any], args: argparse.Namespace, threads: int, work: Path) -> dict[str, Any]:
    step = step_seconds(case["model"], threads, work)
    long = max(8, int(args.minutes * 60 / step)) // 2 * 2
    lengths = (long // 2, long)
    data = {n: write_data(work / f"train-{n}.jsonl", n) for n in lengths}
    runs: dict[str, dict[int, list[dict[str, float]]]] = {"native": {}, "flow": {}}
    for repeat in range(args.repeat):
        for n in lengths:
            runs["native"].setdefault(n, []).append(native_run(case["model"], data[n], threads, work))
            key = f"{case['model'].replace(':', '-')}-{n}-{repeat}"
            runs["flow"].setdefault(n, []).append(flow_run(case["model"], data[n], threads, work, key))
            print(f"  {case['name']}: {n} batches, repeat {repeat + 1} done", file=sys.stderr, flush=True)
    return {"case": case["name"], "model": case["model"], "step_s": step, "lengths": lengths, "runs": runs}


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Per repeat: ratios at each length, slopes, fixed costs; each list is later shown as median (min-max)."""
    short, long = result["lengths"]
    runs = result["runs"]
    out: dict[str, Any] = {"ratio": {}, "slope": {}, "fixed": {}, "first": {}, "tail": {}}
    for n in (short, long):
        pairs = zip(runs["flow"][n], runs["native"][n], strict=True)
        out["ratio"][n] = [f["total"] / a["total"] for f, a in pairs]
    for variant in ("native", "flow"):
        slopes = [
            (b["total"] - a["total"]) / (long - short)
            for a, b in zip(runs[variant][short], runs[variant][long], strict=True)
        ]
        out["slope"][variant] = slopes
        out["fixed"][variant] = [a["total"] - s * short for a, s in zip(runs[variant][short], slopes, strict=True)]
        out["first"][variant] = [r["first"] for n in (short, long) for r in runs[variant][n]]
        out["tail"][variant] = [r["tail"] for n in (short, long) for r in runs[variant][n]]
    out["slope_ratio"] = [f / a for f, a in zip(out["slope"]["flow"], out["slope"]["native"], strict=True)]
    return out


def spread(values: list[float], fmt: str = ".2f") -> str:
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(result: dict[str, Any]) -> list[str]:
    figures = analyse(result)
    short, long = result["lengths"]
    first_extra = statistics.median(figures["first"]["flow"]) - statistics.median(figures["first"]["native"])
    tail = statistics.median(figures["tail"]["flow"])
    slope_ratio = statistics.median(figures["slope_ratio"])
    ratio_long = statistics.median(figures["ratio"][long])

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"{result['case']} ({result['model']}, native step {result['step_s'] * 1000:.0f} ms here):",
        f"  flow/native wall time, {long} batches    {spread(figures['ratio'][long], '.3f'):>24}   target <= "
        f"{RATIO_TARGET}: {verdict(ratio_long <= RATIO_TARGET)}",
        f"  flow/native wall time, {short} batches    {spread(figures['ratio'][short], '.3f'):>24}",
        f"  per batch, flow/native                {spread(figures['slope_ratio'], '.3f'):>24}   target <= "
        f"{RATIO_TARGET}: {verdict(slope_ratio <= RATIO_TARGET)}",
        f"  per batch ms, native / flow           {spread([s * 1e3 for s in figures['slope']['native']], '.1f'):>24}"
        f" / {spread([s * 1e3 for s in figures['slope']['flow']], '.1f')}",
        f"  fixed s, native / flow                {spread(figures['fixed']['native']):>24} / "
        f"{spread(figures['fixed']['flow'])}",
        f"  first batch s, native / flow          {spread(figures['first']['native']):>24} / "
        f"{spread(figures['first']['flow'])}   target: flow <= native + {FIRST_BATCH_EXTRA_S:g} s: "
        f"{verdict(first_extra <= FIRST_BATCH_EXTRA_S)}",
        f"  last batch to exit s, native / flow   {spread(figures['tail']['native']):>24} / "
        f"{spread(figures['tail']['flow'])}   target: flow <= {LAST_TO_EXIT_S:g} s: {verdict(tail <= LAST_TO_EXIT_S)}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="runs of ~10 s, one repeat (checks the script)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--minutes", type=float, default=2.0, help="native training time of the longer run")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved repeats of every run")
    parser.add_argument("--threads", type=int, help="torch threads of both (default: the flow's default)")
    parser.add_argument("--json", help="also write the raw runs and figures as JSON to this file")
    parser.add_argument("--device", help="cpu or cuda for the flow's worker (native gliner2 uses CUDA when present)")
    parser.add_argument("--bf16", action="store_true", help="bf16 in both (CUDA with native bf16 only)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    CONFIG["bf16"] = bool(args.bf16)
    if args.quick:
        args.minutes, args.repeat = 1 / 6, 1
    from prefect_gliner2.runtime.resources import default_cpu_threads

    threads = args.threads or default_cpu_threads()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    results = []
    print(
        f"flow (default settings) vs native ExtractorTrainer.train(), validation off in both, {threads} torch "
        f"thread(s), {DEVICE or 'default device'}, {'bf16' if args.bf16 else 'fp32'}; median (min-max) of "
        f"{args.repeat} interleaved repeat(s)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-flow-", dir=os.environ.get("BENCH_TMP")) as tmp:
        for key in args.cases.split(","):
            work = Path(tmp) / key
            work.mkdir()
            results.append(bench_case(CASES[key], args, threads, work))
            print("\n".join(report(results[-1])), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps([{**r, "figures": analyse(r)} for r in results], indent=1))


if __name__ == "__main__":
    main()
