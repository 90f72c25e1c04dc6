"""The spare worker started by ``train_flow``'s call against the one started in the flow's function, side by side.

    python bench/spare_at_call.py [--model tiny:span:256x2] [--batches 12] [--repeat 4]

Each run is ``bench/flow.py``'s flow script (default settings, validation off) in a fresh interpreter against one
local Prefect server started before any clock. Two variants take turns (the order alternating):

- call: ``train_flow(...)``: the call starts the spare worker before Prefect serializes the parameters and creates the
  flow run (``flows/spare_first.py``);
- body: ``train_flow.with_options()(...)``, a plain ``Flow`` copy: the spare starts in the flow's function, once the
  flow run is Running (the flow as it was before ``spare_first``).

Printed per variant, median (min-max) in seconds: the worker's start after the flow process's (both creation times as
/proc records them), launch to the first batch (the first training task's result in the flow), launch to exit; then
the median of the paired differences body - call (what starting at the call saves).
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
sys.path.insert(1, str(ROOT / "bench"))
sys.path.insert(2, str(ROOT / "tests"))

import flow  # noqa: E402  (bench/flow.py: the flow script, data and environment)

VARIANTS = ("call", "body")
_SPAWNED = """
import psutil
from prefect_gliner2.flows.reporting import add_listener as _add
def _spawned(kind, data):
    if kind == "progress" and "spawned" not in marks:
        me = psutil.Process()  # both creation times from /proc, on the same clock (time.time() is another)
        created = min((c.create_time() for c in me.children(recursive=True)), default=None)
        marks["spawned"] = None if created is None else created - me.create_time()
_add(_spawned)
"""


def one_run(variant: str, model: str, data: str, work: Path, key: str, api: str) -> dict[str, float]:
    script = flow.flow_script(model, data, 2, key, str(work / "runs"))
    script = script.replace("add_listener(listen)", "add_listener(listen)" + _SPAWNED, 1)
    if variant == "body":
        script = script.replace("train_flow(model=", "train_flow.with_options()(model=", 1)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=api, BENCH_SERVER_PIDS=str(os.getpid()), **flow.ENV)
    started = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    ended = time.time()
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{variant} run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    marks = json.loads(line[6:])
    spawned = marks.get("spawned")
    return {
        "worker spawned": float("nan") if spawned is None else spawned,
        "first batch": marks["first"] - started,
        "exit": ended - started,
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:span:256x2")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=4, help="pairs of runs")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from support.prefect_harness import local_prefect_server

    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-spare-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        data = flow.write_data(work / "train.jsonl", args.batches)
        with local_prefect_server() as api:
            for repeat in range(args.repeat):
                order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    key = f"spare-{variant}-{repeat}"
                    runs[variant].append(one_run(variant, args.model, data, work, key, api))
                    print(f"  {variant} run {repeat + 1}: {runs[variant][-1]}", file=sys.stderr, flush=True)
    print(f"{args.model}, {args.batches} batches, {args.repeat} pairs; seconds from launch, median (min-max)")
    for part in ("worker spawned", "first batch", "exit"):
        for variant in VARIANTS:
            print(f"  {variant:5s} {part:15s} {spread([r[part] for r in runs[variant]])}")
        saved = [b[part] - c[part] for b, c in zip(runs["body"], runs["call"], strict=True)]
        print(f"  body - call {part:15s} {spread(saved)}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
