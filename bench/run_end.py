"""The fixed costs at both ends of a training flow run, part by part: what a user waits for before the first batch
and after the last one.

    python bench/run_end.py                       # the ~1 s bench model (tiny:span:768x6), 10 batches, 2 runs
    python bench/run_end.py --model tiny:span --batches 6 --runs 3

Each run is ``bench/flow.py``'s flow script (default settings, validation off) in a fresh interpreter against a local
Prefect server started once, before any clock. Printed per run, in seconds:

- worker spawned: the flow process's creation to the session worker's (both as /proc records them; the flow
  process's interpreter, Prefect's import, the flow run, the plan, manifest and lease come before it);
- first batch: launch to the first training task's result in the flow;
- after the last batch, from the Prefect API's task runs and the flow run: the epoch-end checkpoint task, the export
  task, the flow run's end as the server recorded it, ``train_flow`` returning in the script, the process's exit;
- whether the export's weights file is the final checkpoint's (one file linked under two names).

Then, in this process: the BLAKE3 pass that decides the link (``payload_entry`` over the model's weights, nothing
written), and ``SessionWorker.close()`` of a worker that trained two batches (the worker's exit after "close").
Median (min-max) over ``--runs``. Scratch timings of the same parts are in docs/benchmarks.md's "How to read it".
"""

from __future__ import annotations

import argparse
import asyncio
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
sys.path.insert(1, str(ROOT / "bench"))
sys.path.insert(2, str(ROOT / "tests"))

import flow  # noqa: E402  (bench/flow.py: the flow script, data and environment)

_SPAWNED = """
import psutil
from prefect_gliner2.flows.reporting import add_listener as _add
def _spawned(kind, data):
    if kind == "progress" and "spawned" not in marks:
        me = psutil.Process()  # both creation times from /proc, on the same clock (time.time() is another)
        created = max((c.create_time() for c in me.children(recursive=True)), default=None)
        marks["spawned"] = None if created is None else created - me.create_time()
_add(_spawned)
"""


def one_run(model: str, data: str, work: Path, key: str, api: str) -> dict[str, Any]:
    script = flow.flow_script(model, data, 2, key, str(work / "runs"))
    script = script.replace("add_listener(listen)", "add_listener(listen)" + _SPAWNED, 1)
    script = script.replace('print("BENCH "', 'marks["returned"] = time.time(); print("BENCH "', 1)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=api, BENCH_SERVER_PIDS=str(os.getpid()), **flow.ENV)
    started = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    ended = time.time()
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"flow run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    marks = json.loads(line[6:])
    last = marks["last"]
    parts = asyncio.run(_server_parts(last))
    run_dir = work / "runs" / key
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "weights.safetensors"
    exported = run_dir / "export" / "model.safetensors"
    return {
        "worker spawned": marks["spawned"] if marks.get("spawned") is not None else float("nan"),
        "first batch": marks["first"] - started,
        "last batch to exit": ended - last,
        **parts,
        "train_flow returned": marks["returned"] - last,
        "process exit": ended - last,
        "linked": os.stat(checkpoint).st_ino == os.stat(exported).st_ino,
    }


async def _server_parts(last: float) -> dict[str, float]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        run = (await client.read_flow_runs(limit=1, sort="START_TIME_DESC"))[0]
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    out: dict[str, float] = {}
    for task in tasks:
        if task.start_time is None or task.end_time is None:
            continue
        for prefix, name in (("checkpoint", "checkpoint task"), ("export", "export task")):
            if task.name.startswith(prefix) and task.end_time.timestamp() > last:
                out[name] = task.end_time.timestamp() - task.start_time.timestamp()
    if run.end_time is not None:
        out["flow run ended"] = run.end_time.timestamp() - last
    return out


def hash_pass(model: str) -> float:
    """Seconds of the BLAKE3 pass ``native_save`` makes before it links: the model's weights as the export would
    write them, hashed, nothing written (median of 3)."""
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.checkpoint.writer import payload_entry
    from prefect_gliner2.training.state import write_tensors

    tensors = {name: tensor.contiguous() for name, tensor in load_model(model).state_dict().items()}
    times = []
    for _ in range(3):
        begun = time.perf_counter()
        payload_entry(lambda handle: write_tensors(handle, tensors, like_save_file=True))
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


def worker_close(model: str, data: str, work: Path) -> float:
    """Seconds of ``SessionWorker.close()`` (waiting for the exit) after the worker trained two batches."""
    from prefect_gliner2.runtime.protocol import Advance
    from prefect_gliner2.runtime.rundir import RunDirectory
    from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec
    from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig

    config = TrainingConfig.from_dict({**flow.CONFIG, "output_dir": str(work / "close-out")})
    plan = ManagedTrainingPlan(data, config, architecture="span")
    run_dir = RunDirectory(str(work / "close-runs"), "close")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(None))
    worker = SessionWorker(WorkerSpec(model, run_dir.manifest_uri, 2), restore_locator=lambda: None)
    worker.call(Advance(first=0, through=1))
    begun = time.perf_counter()
    worker.close()
    return time.perf_counter() - begun


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:span:768x6", help="a model flow.py knows (default: the ~1 s one)")
    parser.add_argument("--batches", type=int, default=10, help="plan length (batches of 4 records)")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    from support.prefect_harness import local_prefect_server

    with tempfile.TemporaryDirectory(prefix="bench-run-end-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        data = flow.write_data(work / "train.jsonl", args.batches)
        runs = []
        with local_prefect_server() as api:
            os.environ["PREFECT_API_URL"] = api
            for i in range(args.runs):
                runs.append(one_run(args.model, data, work, f"end-{i}", api))
        print(f"{args.model}, {args.batches} batches, {args.runs} runs; seconds, median (min-max)")
        for name in runs[0]:
            if name == "linked":
                print(f"  export shares the final checkpoint's weights file: {[r['linked'] for r in runs]}")
                continue
            values = [r[name] for r in runs if name in r]
            where = {"worker spawned": "after the flow process started", "first batch": "after launch"}.get(
                name, "after the last batch"
            )
            print(f"  {name:<28} {spread(values):>20}   {where}")
        print(f"  SessionWorker.close()        {worker_close(args.model, data, work):>8.2f}   (after two batches)")
        print(f"  BLAKE3 pass before a link    {hash_pass(args.model):>8.2f}   (the export's weights, nothing written)")


if __name__ == "__main__":
    main()
