"""The fixed cost of one checkpoint on a small model, as the flow pays it, part by part, with its spread.

    python bench/checkpoint_cost.py [--model tiny:span] [--checkpoints 40] [--keep 3] [--quick] [--json OUT]

A real session worker process (the one a flow run starts) trains a tiny model; after each batch the flow side's
checkpoint unit runs as the checkpoint task runs it, each part timed:

- worker save: the ``Checkpoint`` request to the worker and its reply (the worker writes the checkpoint: files
  streamed through BLAKE3, every file and the staging directory fsynced, the rename, the parent fsynced);
- cursor: ``RunDirectory.commit_cursor`` (the cursor read, then replaced atomically: temp file, fsync, rename, fsync
  of the directory);
- prune: retention (``keep`` checkpoints: the oldest one deleted) and the blob sweep;
- event: the ``checkpoint.committed`` event built as ``emit_event`` builds it (a Prefect ``Event``; sending it is a
  queue put to Prefect's events thread).

Not included: Prefect's own per-task cost of the checkpoint task (a task run's states on the server). Printed: the
median and the 10th-90th percentile of each part and of the whole unit over the checkpoints (the first two are
warm-up and not counted), beside one raw write+fsync of the same number of bytes as one file and ten small ones.
Target: the whole unit under 50 ms (median).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefect.events import Event  # noqa: E402

from prefect_gliner2.runtime.events import CHECKPOINT_COMMITTED, run_event  # noqa: E402
from prefect_gliner2.runtime.protocol import Advance, Checkpoint  # noqa: E402
from prefect_gliner2.runtime.resources import prune_blobs, prune_checkpoints  # noqa: E402
from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory  # noqa: E402
from prefect_gliner2.runtime.worker import SessionWorker, WorkerSpec  # noqa: E402
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, layout  # noqa: E402
from prefect_gliner2.training.tiny import tiny_records  # noqa: E402

TARGET_MS = 50.0
PARTS = ("worker save", "cursor", "prune", "event")


def spread(values: list[float]) -> str:
    """Median and 10th-90th percentile, in ms."""
    ms = sorted(v * 1000 for v in values)
    low, high = ms[len(ms) // 10], ms[(len(ms) * 9) // 10 if len(ms) > 1 else 0]
    return f"{statistics.median(ms):7.1f} ms  ({low:.1f}-{high:.1f})"


def raw_writes(folder: Path, size: int, files: int) -> float:
    """Seconds to write `size` bytes as `files` files, each fsynced in turn, and fsync the folder."""
    folder.mkdir()
    block = os.urandom(max(1, size // files))
    started = time.perf_counter()
    for i in range(files):
        with open(folder / f"f{i}", "wb") as handle:
            handle.write(block)
            handle.flush()
            os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - started
    shutil.rmtree(folder)
    return seconds


def checkpoint_unit(worker: SessionWorker, run_dir: RunDirectory, index: int, keep: int, fingerprint: str) -> dict:
    """One checkpoint after batch `index`, as the checkpoint task does it; seconds per part."""
    name = layout.checkpoint_name(index + 1, index)
    times: dict[str, float] = {}
    started = time.perf_counter()
    info = worker.call(Checkpoint(index=index, uri=run_dir.checkpoint_uri(name)))
    times["worker save"] = time.perf_counter() - started
    assert info.committed, info.reason
    started = time.perf_counter()
    cursor = DurableCursor(
        checkpoint=name, cursor=info.cursor, step=info.step, epoch=info.epoch, finished=info.finished,
        fingerprint=fingerprint,
    )  # fmt: skip
    run_dir.commit_cursor(cursor)
    times["cursor"] = time.perf_counter() - started
    started = time.perf_counter()
    pruned = prune_checkpoints(run_dir, keep, best_step=info.best_step)
    prune_blobs(run_dir)
    times["prune"] = time.perf_counter() - started
    started = time.perf_counter()
    payload = {"run_dir": run_dir.uri, "name": name, "cursor": info.cursor, "step": info.step, "pruned": pruned}
    Event(**run_event(CHECKPOINT_COMMITTED, run_dir.run_key, None, payload))
    times["event"] = time.perf_counter() - started
    return times


def measure(model: str, checkpoints: int, keep: int, tmp: Path) -> dict[str, Any]:
    config = TrainingConfig(
        output_dir=str(tmp / "out"), batch_size=2, gradient_accumulation_steps=1, num_epochs=1, eval_strategy="no",
        save_best=False, fp16=False, bf16=False, seed=1,
    )  # fmt: skip
    plan = ManagedTrainingPlan(tiny_records(2 * checkpoints + 8, seed=3), config, architecture=model.split(":")[1])
    run_dir = RunDirectory(str(tmp / "runs"), "cost")
    run_dir.create()
    run_dir.ensure_manifest(plan.manifest_bytes())
    worker = SessionWorker(WorkerSpec(model, run_dir.manifest_uri, 1))
    rows: list[dict[str, float]] = []
    try:
        for index in range(checkpoints + 2):
            worker.call(Advance(first=index, through=index))
            rows.append(checkpoint_unit(worker, run_dir, index, keep, plan.fingerprint))
    finally:
        worker.close()
    rows = rows[2:]  # warm-up
    newest = Path(run_dir.path) / layout.CHECKPOINTS_DIR / run_dir.committed_checkpoints()[-1]
    files = [p for p in newest.iterdir() if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    raw_one = [raw_writes(tmp / f"raw1-{i}", size, 1) for i in range(5)]
    raw_many = [raw_writes(tmp / f"rawn-{i}", size, len(files)) for i in range(5)]
    return {
        "model": model,
        "checkpoints": len(rows),
        "bytes": size,
        "files": len(files),
        "parts": {part: [row[part] for row in rows] for part in PARTS},
        "unit": [sum(row.values()) for row in rows],
        "raw_one_file": raw_one,
        "raw_files": raw_many,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny:span")
    parser.add_argument("--checkpoints", type=int, default=40)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="12 checkpoints")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args()
    count = 12 if args.quick else args.checkpoints
    with tempfile.TemporaryDirectory(prefix="checkpoint-cost-", dir=os.environ.get("BENCH_TMP")) as tmp:
        result = measure(args.model, count, args.keep, Path(tmp))
    print(
        f"{result['model']}: {result['checkpoints']} checkpoints of {result['bytes'] / 1e6:.2f} MB in "
        f"{result['files']} files (keep {args.keep}); median (10th-90th percentile); load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    for part in PARTS:
        print(f"  {part:24} {spread(result['parts'][part])}")
    unit = statistics.median(result["unit"]) * 1000
    verdict = "met" if unit < TARGET_MS else "NOT met"
    print(f"  {'checkpoint unit':24} {spread(result['unit'])}  target < {TARGET_MS:.0f} ms: {verdict}")
    print(f"  {'raw write, 1 file':24} {spread(result['raw_one_file'])}  (the same bytes, write + fsync)")
    label = f"raw write, {result['files']} files"
    print(f"  {label:24} {spread(result['raw_files'])}  (fsynced one after another)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
