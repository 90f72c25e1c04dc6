"""Session worker starts: forked from the preloaded server (``PREFECT_GLINER2_WORKER_START=forkserver``, the default)
against a fresh interpreter per worker (``spawn``), side by side in one run.

    python bench/worker_start.py                  # 4 workers one after another per process, 3 rounds
    python bench/worker_start.py --workers 6 --repeat 5

Each round runs both modes (their order alternating) in a fresh interpreter each, which starts ``--workers``
session workers one after another on the same run (the tiny span model, spare worker off), each until it answers
``Status`` (built its session: "ready"), then closes it: what a sweep's trials, a retrain's training and scoring
workers, or a served deployment's runs do in one process. Printed per mode, median (min-max) over the rounds: the
first worker's start (the server's imports come first), the later workers' (median of each round), the process's
wall time and the CPU seconds of the process and every process below it (``RUSAGE_CHILDREN``); then the ratios
forkserver / spawn. Last, the memory of a forkserver and of an idle worker it forked (``/proc/PID/smaps_rollup``:
resident, proportional, shared): what the server costs while its flow process lives.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

MODES = ("spawn", "forkserver")


def child(model: str, manifest: str, workers: int) -> None:
    from prefect_gliner2.runtime.protocol import Status
    from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec

    ready = []
    for _ in range(workers):
        worker = SessionWorker(WorkerSpec(model, manifest, 1))
        started = time.perf_counter()
        worker.call(Status())
        ready.append(time.perf_counter() - started)
        worker.close()
    print("BENCH " + json.dumps(ready), flush=True)


def prepare(work: Path) -> tuple[str, str]:
    from prefect_gliner2.runtime.rundir import RunDirectory
    from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig

    from support.config import training_config
    from support.flow import make_inputs, tiny_model_dir

    inputs = make_inputs(work / "data")
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(training_config()), architecture="span")
    run_dir = RunDirectory(str(work / "runs"), "bench")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes(inputs["valid"]))
    return tiny_model_dir(work, "span"), run_dir.manifest_uri


def memory() -> None:
    """Start a forkserver and one forked worker (idle, waiting for its run) in this process; print their memory."""
    os.environ.update(PREFECT_GLINER2_WORKER_START="forkserver", PREFECT_GLINER2_SPARE_WORKER="off")
    from prefect_gliner2.runtime.forkserver import server_pids, start_worker_process
    from prefect_gliner2.runtime.spawn import reap

    process, conn = start_worker_process("bench-idle")
    worker = process.pid
    time.sleep(1.0)
    for name, pid in (("forkserver", server_pids()[-1]), ("idle forked worker", worker)):
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split()[:2]
            fields[key.rstrip(":")] = int(value) / 1024
        shared = fields["Shared_Clean"] + fields["Shared_Dirty"]
        resident, proportional = fields["Rss"], fields["Pss"]
        print(f"{name:<19} resident {resident:4.0f} MB, proportional {proportional:4.0f} MB, shared {shared:4.0f} MB")
    conn.close()
    reap(process, 10)


def one(mode: str, model: str, manifest: str, workers: int) -> dict[str, float]:
    env = dict(os.environ, PREFECT_GLINER2_WORKER_START=mode, PREFECT_GLINER2_SPARE_WORKER="off")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", model, manifest, str(workers)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))
    ready = json.loads(line[6:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first": ready[0], "later": statistics.median(ready[1:]), "wall": wall, "cpu": cpu}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "MANIFEST", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.workers < 2:
        parser.error("--workers must be at least 2 (the first start and the later ones are reported apart)")
    with tempfile.TemporaryDirectory(prefix="worker-start-", dir=os.environ.get("BENCH_TMP")) as work:
        model, manifest = prepare(Path(work))
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for round_ in range(args.repeat):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                results[mode].append(one(mode, model, manifest, args.workers))
                print(f"round {round_ + 1} {mode}: {json.dumps(results[mode][-1])}", flush=True)
    print(f"\n{args.workers} workers one after another per process, {args.repeat} rounds, seconds:")
    print(f"{'mode':<11} {'first ready':>18} {'later ready':>18} {'process wall':>18} {'CPU, all processes':>20}")
    for mode in MODES:
        rows = results[mode]
        cells = [summary([r[k] for r in rows]) for k in ("first", "later", "wall", "cpu")]
        print(f"{mode:<11} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18} {cells[3]:>20}")
    ratio = {
        k: statistics.median(f[k] / s[k] for f, s in zip(results["forkserver"], results["spawn"], strict=True))
        for k in ("first", "later", "wall", "cpu")
    }
    print("forkserver / spawn (median of the rounds' ratios): " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    memory()


if __name__ == "__main__":
    main()
