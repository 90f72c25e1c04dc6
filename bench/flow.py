"""The training flow with its default settings against gliner2's own ``ExtractorTrainer.train()`` on the same plan:
wall-time ratios, the cost per batch (the slope over two run lengths) and the fixed costs, each with its spread.

    python bench/flow.py                 # tiny (~15 ms), ~100 ms and ~1 s steps; runs of ~2 minutes (about 60 min)
    python bench/flow.py --quick         # short runs, one repeat: checks the script (a few minutes)
    python bench/flow.py --cases tiny --minutes 3 --repeat 3 --json out.json

What is compared, per case, in fresh interpreters that each import, build the model, train and exit (wall time from
launch to exit):

- native: gliner2's ``ExtractorTrainer(model, config).train(records)``, the same config (the session's
  ``to_native_kwargs``), with its default saving (validation is off, so only its final model is saved), on the
  flow's plan as the flow trains it: the plan's records with their negative labels (``negative_label_prob``) and
  gliner2's own label shuffling switched on (``shuffle_entity_labels``), so that both do the same arithmetic;
- flow: ``train_flow(...)`` with default settings (automatic task grain and pipelining, the automatic checkpoint
  cadence and the epoch end, keep 3, export) against a local Prefect server (SQLite);
- native, retaining: the native run again with the memory setting the flow gives its worker (glibc's malloc
  thresholds raised: ``prefect_gliner2.runtime.spawn.worker_environment``). The flow's worker reuses the memory
  it frees, which a native run as users start it does not; flow against this run is the flow's own cost with the
  allocator taken out of the comparison.

Each group of runs (native, flow, native retaining; the order rotating between groups) has a fresh Prefect server of
its own, started before any clock starts and up and idle during every run: a user's running server, on the same cores
(about a tenth of a core idle), not the CLI's embedded one. Same data (``tiny_records``), config (batch 4, one
epoch, seed 3), thread count (``--threads``, default the flow's own default: this machine's usable CPUs) and model
(the built-in ``tiny:span`` shapes). Validation is off in both (like with like: native validation computes a loss
only, the flow's also extracts and scores). One plan length per case (about ``--minutes`` of native training),
``--repeat`` groups. Printed per case, as median (min-max) over the groups, and for the ratios the mean with its 95%
t-interval (the resolution the run achieved):

- wall time: flow / native, launch to exit (target <= 1.05 for runs of a few minutes);
- per batch: inside each run, the time from its first to its last batch mark over the batches between them (native:
  optimizer steps returned; flow: training tasks' results reaching the flow, so task boundaries, checkpoints and
  progress reports are inside), flow / native (target <= 1.05); the fixed cost is the rest of the wall time;
- at 5 minutes: the wall-time ratio of a run of 5 minutes of native training, computed from each group's measured
  fixed costs and costs per batch (the runs themselves last ``--minutes``);
- CPU seconds: of every process (the run and its children, plus what the Prefect server spent meanwhile), flow /
  native; less sensitive than wall time to what else the machine does;
- orchestration CPU: inside each flow run, between its first and last batch marks, the CPU seconds of the flow
  process (Prefect's client and task machinery, the driver, reporting) plus the server's above its idle rate (the
  rate it ran at during the same group's native runs), in percent of the worker's training CPU. Wall-time ratios of
  separate runs move by several percent between identical runs on a shared machine; this figure is measured inside
  one run and resolves the flow's own per-batch cost to a fraction of a percent. Where the worker keeps every core
  busy it is also the most the orchestration can add to the time per batch;
- first batch: launch to the first batch trained (native: its first optimizer step returned; flow: the first
  training task's result reached the flow); target: the flow at most ``FIRST_BATCH_EXTRA_S`` after native;
- last batch to exit: the last batch trained to the process's exit (checkpoint, export, final report); target
  <= ``LAST_TO_EXIT_S`` for the flow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
EXTRAPOLATE_MINUTES = 5.0
VARIANTS = ("native", "flow", "native_retain")
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "PREFECT_LOGGING_LEVEL": "WARNING"}

_NATIVE = """
import json, sys, time
import torch
torch.set_num_threads({threads})
from gliner2.training.trainer import ExtractorTrainer, TrainingConfig as NativeConfig
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.training.engine.setup import configure_sampling
with open({data!r}, encoding="utf-8") as handle:
    records = [json.loads(line) for line in handle]
config = TrainingConfig.from_dict({config!r})
# the flow's plan, augmented as the flow trains it (negative labels), and gliner2's label shuffling on: like with like
plan = ManagedTrainingPlan(records, config, architecture="span")
records = [example for i in range(plan.batch_count) for example in plan.batch(i).examples]
kwargs = config.to_native_kwargs()
kwargs.update(output_dir={out!r}, fp16=False, pin_memory=False, report_to_wandb=False, num_workers=0)
model = load_model({model!r})
configure_sampling(model.processor, shuffle_entities=config.shuffle_entity_labels,
                   synthetic_entity_label_prob=config.synthetic_entity_label_prob)
trainer = ExtractorTrainer(model, NativeConfig(**kwargs))
marks = {{"steps": 0}}
step = trainer._optimizer_step
def timed(*args, **kwargs):
    result = step(*args, **kwargs)
    now = time.time()
    marks.setdefault("first", now)
    marks["last"] = now
    marks["steps"] += 1
    if {stream}:  # bench/flow_sliced.py: every mark as it happens
        print(f"MARK {{now!r}} {{marks['steps']}}", flush=True)
    return result
trainer._optimizer_step = timed
trainer.train(train_data=records)
marks["window_batches"] = marks["steps"] - 1  # one batch per step (no accumulation): batches after the first mark
print("BENCH " + json.dumps(marks))
"""

_FLOW = """
import dataclasses, json, os, time
import psutil
from prefect_gliner2.flows.reporting import add_listener
marks = {{}}
SERVER = [psutil.Process(int(pid)) for pid in os.environ["BENCH_SERVER_PIDS"].split(",")]
def cpu(processes):
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total
def window_cpu():  # this process (the flow: Prefect client, tasks, reporting), its worker, the server
    me = psutil.Process()
    return {{"flow": cpu([me]), "worker": cpu(me.children(recursive=True)), "server": cpu(SERVER)}}
def listen(kind, data):
    if kind == "progress":
        now = time.time()
        if "first" not in marks:
            marks["first"], marks["first_cursor"], marks["first_cpu"] = now, data.get("cursor", 0), window_cpu()
        if data.get("cursor", 0) >= data.get("batch_count", 1):
            marks["last"], marks["last_cpu"] = now, window_cpu()
            marks["window_batches"] = data["batch_count"] - marks["first_cursor"]
        if {stream}:  # bench/flow_sliced.py: every mark as it happens
            print(f"MARK {{now!r}} {{data.get('cursor', 0)}}", flush=True)
add_listener(listen)
from prefect_gliner2.flows import driver
observe = driver._observe
def unstopped(seconds):  # bench/flow_sliced.py: a unit's seconds less the times this run was stopped in them
    now = time.time()
    with open(os.environ["BENCH_STOPS"], encoding="utf-8") as handle:
        stops = [tuple(map(float, line.split())) for line in handle if line.strip()]
    return seconds - sum(max(0.0, min(end, now) - max(start, now - seconds)) for start, end in stops)
def timed(grain, result):  # the worker's own seconds training each unit's batches (validation excluded)
    if {stream}:  # stopped time out of the automatic grain's and cadence's measurement: they see unstopped units
        result = dataclasses.replace(result, seconds=unstopped(result.seconds))
    marks["worker_batches"] = marks.get("worker_batches", 0) + result.trained
    marks["worker_seconds"] = marks.get("worker_seconds", 0.0) + result.seconds
    return observe(grain, result)
driver._observe = timed
from prefect_gliner2.flows.train import train_flow
train_flow(model={model!r}, train_data={data!r}, config={config!r}, run_key={key!r}, storage={storage!r},
           execution={{"cpu_threads": {threads}, "device": {device!r}}})
print("BENCH " + json.dumps(marks))
"""


def step_seconds(model: str, threads: int, work: Path) -> float:
    """The native step time of `model`, measured in this process (median of 6 steps after 2 warm-ups)."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
    from prefect_gliner2.training.tiny import tiny_records

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
    from prefect_gliner2.training.tiny import tiny_records

    records = tiny_records(batches * CONFIG["batch_size"], seed=1)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def cpu_seconds(processes: list[Any]) -> float:
    """User + system CPU seconds of `processes` (psutil), those still alive."""
    import psutil

    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def launch(script: str, env: dict[str, str], server: list[Any]) -> dict[str, float]:
    """Run `script` in a fresh interpreter; wall time launch -> exit, its first/last batch marks, the CPU seconds of
    it and its children (the flow's worker), and those the Prefect `server` processes spent meanwhile."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = cpu_seconds(server)
    started = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"benchmark run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    marks = json.loads(line[6:])
    return {
        "total": ended - started,
        "first": marks["first"] - started,
        "tail": ended - marks["last"],
        "per_batch": (marks["last"] - marks["first"]) / max(marks["window_batches"], 1),
        "window_batches": marks["window_batches"],
        "worker_per_batch": marks["worker_seconds"] / marks["worker_batches"] if "worker_seconds" in marks else None,
        "cpu": after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime,
        "server_cpu": cpu_seconds(server) - server_before,
        **window_cpu(marks),
    }


def window_cpu(marks: dict[str, Any]) -> dict[str, float]:
    """A flow run's CPU seconds between its first and last batch marks, per process: ``window_flow`` (the flow
    process: Prefect's client and task machinery, the driver, reporting), ``window_worker`` (training) and
    ``window_server`` (the Prefect server, idle share included); empty for a native run."""
    if "first_cpu" not in marks:
        return {}
    return {f"window_{key}": marks["last_cpu"][key] - marks["first_cpu"][key] for key in marks["first_cpu"]}


def native_script(model: str, data: str, threads: int, out: str, *, stream: bool = False) -> str:
    """The native run's script (`stream`: also print each batch mark as it happens, "MARK <time> <batches>")."""
    return _NATIVE.format(threads=threads, data=data, config=CONFIG, out=out, model=model, stream=stream)


def flow_script(model: str, data: str, threads: int, key: str, storage: str, *, stream: bool = False) -> str:
    """The flow run's script (`stream`: also print each progress mark as it happens, "MARK <time> <cursor>")."""
    return _FLOW.format(
        model=model, data=data, config=CONFIG, key=key, storage=storage, threads=threads, device=DEVICE, stream=stream
    )


def native_run(
    model: str, data: str, threads: int, work: Path, server: list[Any], *, retain: bool = False
) -> dict[str, float]:
    """gliner2's own train() in a fresh interpreter; `retain`: with the memory setting of the flow's worker."""
    from prefect_gliner2.runtime.spawn import worker_environment

    out = tempfile.mkdtemp(prefix="native-", dir=work)
    script = native_script(model, data, threads, out)
    memory = worker_environment({}) if retain else {}
    return launch(script, dict(os.environ, PYTHONPATH=str(ROOT), **ENV, **memory), server)


def flow_run(
    model: str, data: str, threads: int, work: Path, key: str, api: str, server: list[Any]
) -> dict[str, float]:
    script = flow_script(model, data, threads, key, str(work / "runs"))
    pids = ",".join(str(process.pid) for process in server)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=api, BENCH_SERVER_PIDS=pids, **ENV)
    return launch(script, env, server)


def bench_case(case: dict[str, Any], args: argparse.Namespace, threads: int, work: Path) -> dict[str, Any]:
    """`--repeat` groups of runs of one plan length (native, flow, native retaining), each group beside one fresh
    idle Prefect server (up during every run: a user's server; started before the clock), the order rotating."""
    import psutil

    from support.prefect_harness import local_prefect_server

    step = step_seconds(case["model"], threads, work)
    length = max(8, int(args.minutes * 60 / step))
    data = write_data(work / f"train-{length}.jsonl", length)
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    for repeat in range(args.repeat):
        with local_prefect_server() as api:
            server = psutil.Process().children(recursive=True)
            order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]
            for variant in order:
                if variant != "flow":
                    retain = variant == "native_retain"
                    runs[variant].append(native_run(case["model"], data, threads, work, server, retain=retain))
                else:
                    key = f"{case['model'].replace(':', '-')}-{length}-{repeat}"
                    runs["flow"].append(flow_run(case["model"], data, threads, work, key, api, server))
        print(f"  {case['name']}: {length} batches, group {repeat + 1} done", file=sys.stderr, flush=True)
    return {"case": case["name"], "model": case["model"], "step_s": step, "batches": length, "runs": runs}


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Per pair: the ratios flow/native of the wall time, the cost per batch (inside each run: from its first to its
    last batch mark) and the CPU seconds (all processes, the server's included); and each run's fixed costs."""
    native, flow = result["runs"]["native"], result["runs"]["flow"]

    retaining = result["runs"].get("native_retain") or []

    def paired(key: Callable[[dict[str, float]], float], base: list[dict[str, float]] = native) -> list[float]:
        return [key(f) / key(n) for f, n in zip(flow, base, strict=True)]

    out: dict[str, Any] = {
        "ratio": paired(lambda r: r["total"]),
        "per_batch_ratio": paired(lambda r: r["per_batch"]),
        "cpu_ratio": paired(lambda r: r["cpu"] + r["server_cpu"]),
    }
    variants = ["native", "flow"]
    if retaining:
        out["retain_ratio"] = paired(lambda r: r["total"], retaining)
        out["retain_per_batch_ratio"] = paired(lambda r: r["per_batch"], retaining)
        variants.append("native_retain")
    for key in ("per_batch", "first", "tail", "total", "cpu", "server_cpu"):
        out[key] = {variant: [r[key] for r in result["runs"][variant]] for variant in variants}
    out["fixed"] = {
        variant: [r["total"] - r["per_batch"] * result["batches"] for r in result["runs"][variant]]
        for variant in variants
    }
    for key, base in (("minutes_ratio", "native"), ("retain_minutes_ratio", "native_retain")):
        if base in variants:
            costs = zip(
                out["fixed"]["flow"], out["per_batch"]["flow"], out["fixed"][base], out["per_batch"][base], strict=True
            )
            out[key] = [minutes_ratio(*group) for group in costs]
    out.update(orchestration(result))
    ratios = [key for key in out if key.endswith(("ratio", "share"))]
    out["interval"] = {key: interval(out[key]) for key in ratios}
    return out


def orchestration(result: dict[str, Any]) -> dict[str, Any]:
    """What orchestration costs in CPU while the flow trains, per flow run, measured between its first and last
    batch marks (no fixed costs): the flow process's CPU plus the server's above its idle rate (the rate it ran at
    during the same group's native runs), as a percentage of the worker's CPU, and per batch. CPU seconds of a window of
    thousands of batches vary far less than wall time on a shared machine: this is what resolves the flow's own
    per-batch cost to a fraction of a percent. On a machine whose cores the worker keeps busy it is also the most
    the orchestration can add to the wall time per batch."""
    flows = result["runs"]["flow"]
    if not flows or "window_worker" not in flows[0]:
        return {}
    natives = [result["runs"][v] for v in ("native", "native_retain") if result["runs"].get(v)]
    share, per_batch, server_extra = [], [], []
    for group, run in enumerate(flows):
        idle = statistics.fmean(runs[group]["server_cpu"] / runs[group]["total"] for runs in natives)
        window = run["per_batch"] * run["window_batches"]
        extra = run["window_server"] - idle * window
        cost = run["window_flow"] + extra
        share.append(100 * cost / run["window_worker"])  # percent
        per_batch.append(cost / run["window_batches"])
        server_extra.append(extra)
    return {
        "orchestration_share": share,
        "orchestration_per_batch": per_batch,
        "window_flow": [r["window_flow"] for r in flows],
        "window_worker": [r["window_worker"] for r in flows],
        "window_server_extra": server_extra,
    }


def minutes_ratio(fixed_flow: float, batch_flow: float, fixed_native: float, batch_native: float) -> float:
    """Flow / native wall time of a run of ``EXTRAPOLATE_MINUTES`` of native training, from one group's measured
    fixed costs and costs per batch (the run lengths the goal names, without running them)."""
    batches = EXTRAPOLATE_MINUTES * 60 / batch_native
    return (fixed_flow + batches * batch_flow) / (fixed_native + batches * batch_native)


def spread(values: list[float], fmt: str = ".2f") -> str:
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def half_width(values: list[float]) -> float | None:
    """The 95% t-interval half-width of the mean of `values` (None for fewer than two)."""
    if len(values) < 2:
        return None
    from scipy import stats

    return float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5)


def interval(values: list[float]) -> str:
    """The mean of paired ratios with its 95% t-interval half-width (what the benchmark can resolve)."""
    mean, half = statistics.fmean(values), half_width(values)
    return f"mean {mean:.3f}" if half is None else f"mean {mean:.3f} +- {half:.3f} (95%)"


def report(result: dict[str, Any]) -> list[str]:
    figures = analyse(result)
    first_extra = statistics.median(figures["first"]["flow"]) - statistics.median(figures["first"]["native"])
    tail = statistics.median(figures["tail"]["flow"])

    worker = [r["worker_per_batch"] for r in result["runs"]["flow"] if r.get("worker_per_batch")] or [0.0]

    def verdict(values: list[float]) -> str:
        return "met" if statistics.median(values) <= RATIO_TARGET else "NOT met"

    def both(key: str, scale: float = 1.0, fmt: str = ".2f") -> str:
        native, flow = ([x * scale for x in figures[key][v]] for v in ("native", "flow"))
        return f"{spread(native, fmt):>24} / {spread(flow, fmt)}"

    lines = [
        f"{result['case']} ({result['model']}, native step {result['step_s'] * 1000:.0f} ms here), "
        f"{result['batches']} batches:",
        f"  flow/native wall time                 {spread(figures['ratio'], '.3f'):>24}   "
        f"{figures['interval']['ratio']}; target <= {RATIO_TARGET}: {verdict(figures['ratio'])}",
        f"  per batch, flow/native                {spread(figures['per_batch_ratio'], '.3f'):>24}   "
        f"{figures['interval']['per_batch_ratio']}; target <= {RATIO_TARGET}: {verdict(figures['per_batch_ratio'])}",
        f"  {EXTRAPOLATE_MINUTES:g}-minute run, flow/native             "
        f"{spread(figures['minutes_ratio'], '.3f'):>24}   "
        f"{figures['interval']['minutes_ratio']}; the measured fixed and per-batch costs over a run of "
        f"{EXTRAPOLATE_MINUTES:g} minutes of native training",
        f"  CPU seconds, flow/native              {spread(figures['cpu_ratio'], '.3f'):>24}   "
        f"{figures['interval']['cpu_ratio']} (every process, the idle server's included in both)",
        f"  wall s, native / flow                 {both('total', fmt='.1f')}",
        f"  per batch ms, native / flow           {both('per_batch', 1e3, '.1f')}",
        f"  flow's worker: ms per batch training  {spread([x * 1e3 for x in worker], '.1f'):>24}   "
        f"(its own clock around each batch: the rest of the flow's per batch is orchestration)",
        f"  fixed s, native / flow                {both('fixed')}",
        f"  CPU s, native / flow (server's)       {both('cpu', fmt='.1f')} "
        f"({spread(figures['server_cpu']['native'], '.1f')} / {spread(figures['server_cpu']['flow'], '.1f')})",
        f"  first batch s, native / flow          {both('first')}   target: flow <= native + "
        f"{FIRST_BATCH_EXTRA_S:g} s: {'met' if first_extra <= FIRST_BATCH_EXTRA_S else 'NOT met'}",
        f"  last batch to exit s, native / flow   {both('tail')}   target: flow <= {LAST_TO_EXIT_S:g} s: "
        f"{'met' if tail <= LAST_TO_EXIT_S else 'NOT met'}",
    ]
    lines += orchestration_lines(figures)
    return lines + retaining_lines(figures)


def orchestration_lines(figures: dict[str, Any]) -> list[str]:
    if "orchestration_share" not in figures:
        return []
    share = figures["orchestration_share"]  # percent
    return [
        f"  orchestration CPU / training CPU, %   {spread(share, '.2f'):>24}   "
        f"{figures['interval']['orchestration_share']} between the first and last batch: the flow process "
        f"{spread(figures['window_flow'], '.2f')} s + the server above idle "
        f"{spread(figures['window_server_extra'], '.2f')} s against the worker's "
        f"{spread(figures['window_worker'], '.1f')} s; per batch "
        f"{spread([x * 1e3 for x in figures['orchestration_per_batch']], '.3f')} ms of CPU",
    ]


def retaining_lines(figures: dict[str, Any]) -> list[str]:
    """The flow against native runs given the worker's memory setting: the flow's cost without the allocator."""
    if "retain_ratio" not in figures:
        return []
    retain = figures["total"]["native_retain"]
    per_batch = [x * 1e3 for x in figures["per_batch"]["native_retain"]]
    return [
        f"  native with the worker's memory setting: wall {spread(retain, '.1f')} s, per batch "
        f"{spread(per_batch, '.1f')} ms",
        f"  flow/that native, wall time            {spread(figures['retain_ratio'], '.3f'):>24}   "
        f"{figures['interval']['retain_ratio']}",
        f"  flow/that native, per batch            {spread(figures['retain_per_batch_ratio'], '.3f'):>24}   "
        f"{figures['interval']['retain_per_batch_ratio']}",
        f"  flow/that native, {EXTRAPOLATE_MINUTES:g}-minute run        "
        f"{spread(figures['retain_minutes_ratio'], '.3f'):>24}   {figures['interval']['retain_minutes_ratio']}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="runs of ~10 s, one repeat (checks the script)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--minutes", type=float, default=2.0, help="native training time of each run")
    parser.add_argument("--repeat", type=int, default=3, help="groups of runs (native, flow, native retaining)")
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
        f"{args.repeat} group(s) of runs (native, flow, native retaining), the order rotating, each group beside its "
        "own idle Prefect server"
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
