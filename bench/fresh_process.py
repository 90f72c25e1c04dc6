"""Benchmark pieces that run in a fresh interpreter: a script that prints one ``BENCH <json>`` line, a resume or
fresh start as a restarted worker does it, and the cost of fresh memory on this machine.

A worker is always a fresh process: the memory it fills has never been used by it, unlike a second session in a
benchmark's own process, which reuses what the first one freed. Measuring there is measuring what users get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def uncache(folder: Path) -> None:
    """Drop every file under `folder` from the page cache (written and synced: every page is clean), so that the
    next read of it comes from the disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_bench_script(script: str, env: dict[str, str] | None = None, what: str = "benchmark run") -> dict[str, Any]:
    """Run `script` with ``python -c`` and return the JSON of its ``BENCH `` line; SystemExit with its stderr's
    tail when it fails or prints none."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(line[6:])
    return result


_WORKER_START = """
import json, sys, time
started = time.perf_counter()
import torch
torch.set_num_threads({threads})
from prefect_gliner2.session_core.checkpoint import open_checkpoint, set_hash_threads
from prefect_gliner2.training.prefetch import prefetch_state
set_hash_threads({threads})
if {keep_cache!r}:  # the comparison: the restore before it dropped its checkpoint from the page cache
    from prefect_gliner2.session_core.checkpoint import reader
    reader._drop_cached = lambda handle: None

def head_start():
    open_checkpoint({ckpt!r}, min_version=1)  # the flow side's index check
    prefetch_state({ckpt!r})  # the worker's head start: state files read while the rest loads

if {restore!r} and {spawned!r}:  # a worker spawned for its run: the read begins before transformers and gliner2 load
    head_start()
from gliner2.auto import AutoExtractor
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
from prefect_gliner2.training.tiny import tiny_records
imported = time.perf_counter()
if {restore!r} and not {spawned!r}:  # a spare: its run (and checkpoint) arrives once it has imported everything
    head_start()
cfg = TrainingConfig.from_dict({config!r})
plan = ManagedTrainingPlan(tiny_records({records}, seed=3), cfg, architecture={arch!r})
session = TrainingSession(AutoExtractor.from_pretrained({model!r}), cfg, max_steps=plan.max_steps, device={device!r})
built = time.perf_counter()
if {restore!r}:
    session.load_state({ckpt!r})
loaded = time.perf_counter()
session.forward_backward(plan.batch({batch}))
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
done = time.perf_counter()
session.optim_step()
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
updated = time.perf_counter()
print("BENCH " + json.dumps({{"imports": imported - started, "build": built - imported, "load": loaded - built,
                              "first_batch": done - loaded, "total": done - imported,
                              "first_update": updated - imported, "from_start": done - started,
                              "update_from_start": updated - started}}))
"""


def worker_start(
    *, restore: str | None, keep_cache: bool = False, spawned: bool = False, **settings: Any
) -> dict[str, float]:
    """A fresh interpreter with the worker's environment (its memory setting) that builds a session, loads the
    checkpoint `restore` (after the flow side's index check) when given, trains one batch and takes one optimizer
    step. Seconds from after the imports: ``build``, ``load``, ``first_batch``, ``total`` (to the batch done) and
    ``first_update``; from the script's start (imports included): ``from_start`` and ``update_from_start``.
    `spawned`: the order of a worker spawned for its run (``runtime.worker_child``: the checkpoint's background read
    starts once torch is imported, before transformers and gliner2 are), else of a spare that imported everything
    before its run arrived (the read starts then, while the model is built). `keep_cache`: the restore leaves the
    checkpoint's pages in the page cache, as restores did before they dropped them (for the side-by-side
    comparison). `settings`: threads, config (a TrainingConfig dict), records, arch, model, device, batch."""
    from prefect_gliner2.runtime.spawn import worker_environment

    env = dict(os.environ, PYTHONPATH=str(ROOT), **worker_environment())
    script = _WORKER_START.format(
        restore=restore is not None, ckpt=restore or "", keep_cache=keep_cache, spawned=spawned, **settings
    )
    return run_bench_script(script, env, "worker-like start")


_TOUCH = """
import json, time, torch
torch.set_num_threads({threads})
started = time.perf_counter()
block = torch.ones({size}, dtype=torch.uint8)
print("BENCH " + json.dumps((time.perf_counter() - started) / ({size} / 4096) * 1e6))
"""


def first_touch(gigabytes: float, threads: int) -> float:
    """Microseconds per 4 KiB page to allocate and fill `gigabytes` of fresh memory in a fresh interpreter: what
    every page a load or a first step allocates costs on this machine (on a VM, pages the guest has not used lately
    can cost several times more than recycled ones)."""
    return float(run_bench_script(_TOUCH.format(threads=threads, size=int(gigabytes * (1 << 30))), what="first touch"))
