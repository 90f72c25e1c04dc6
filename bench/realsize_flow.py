"""A real flow run resuming from a real-size checkpoint: the flow process's peak RSS, beside the run's.

    python bench/realsize_flow.py [--arch span] [--json OUT]

Builds a randomly initialised model of the gliner2-base shape offline (`GLINER2_BASE_SIZE`, as `bench/realsize.py`)
and starts a throwaway local Prefect server. A reference `train_flow` run (two optimizer updates, a checkpoint after
each, every checkpoint kept) is then rewound as a kill right after its first checkpoint would have left it (the
cursor names the first checkpoint; the later one and the export never happened), and `train_flow` runs again under
the same run key: it resumes from the real-size checkpoint through the worker's verified load and trains to the end.
Each flow runs in its own fresh interpreter (`support.flow_child`); its peak RSS (`VmHWM`, read when it exits) is
printed for the reference run and the resumed run, with the checkpoint size. Target: the resumed flow process stays
under 300 MB throughout (it reads checkpoint indexes only; the worker, another process, reads the payloads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from prefect_gliner2.session_core import layout  # noqa: E402
from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records  # noqa: E402

#: The flow child, with its peak RSS and whether it imported torch reported on exit (stderr, one JSON line).
_WRAPPER = """
import atexit, json, runpy, sys
def report():
    with open("/proc/self/status") as handle:
        hwm = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
    print("FLOW-PROCESS " + json.dumps({"hwm_kib": hwm, "torch": "torch" in sys.modules}), file=sys.stderr)
atexit.register(report)
sys.argv = ["flow_child", *sys.argv[1:]]
runpy.run_module("support.flow_child", run_name="__main__")
"""


def run_flow(params: dict[str, Any], api_url: str) -> dict[str, Any]:
    """train_flow in a fresh interpreter; its summary, wall time and peak RSS."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), PREFECT_API_URL=api_url)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(params)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    reports = [line for line in done.stderr.splitlines() if line.startswith("FLOW-PROCESS ")]
    if done.returncode != 0 or not reports:
        raise RuntimeError(f"the flow process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    process = json.loads(reports[-1].removeprefix("FLOW-PROCESS "))
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"summary": summary, "seconds": seconds, "rss_mb": process["hwm_kib"] / 1024, "torch": process["torch"]}


def rewind_to_first_checkpoint(run: Path) -> tuple[int, int]:
    """Make `run` look as a kill right after its first checkpoint committed would have left it; returns the batch
    position a resume continues from and the checkpoint's bytes."""
    names = sorted(n for n in os.listdir(run / layout.CHECKPOINTS_DIR) if layout.parse_checkpoint_name(n))
    first = names[0]
    index = json.loads((run / layout.CHECKPOINTS_DIR / first / layout.CHECKPOINT_INDEX_FILE).read_text())
    meta = index["meta"]
    cursor = json.loads((run / layout.CURSOR_FILE).read_text())
    cursor.update(checkpoint=first, cursor=meta["cursor"], step=meta["step"], finished=False)
    cursor.update(epoch=meta.get("epoch", 0), export=None, summary=None)
    (run / layout.CURSOR_FILE).write_text(json.dumps(cursor, sort_keys=True, indent=1))
    for name in names[1:]:
        shutil.rmtree(run / layout.CHECKPOINTS_DIR / name)
    shutil.rmtree(run / layout.EXPORT_DIR, ignore_errors=True)
    size = sum(f.stat().st_size for f in (run / layout.CHECKPOINTS_DIR / first).iterdir())
    return int(meta["cursor"]), size


def measure(arch: str, tmp: Path, api_url: str, threads: int) -> dict[str, Any]:
    model = save_tiny_model(tmp / f"model-{arch}", arch, seed=0, dropout=0.1, **dict(GLINER2_BASE_SIZE))
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(4, seed=5)), encoding="utf-8")
    config = dict(
        fp16=False, bf16=False, batch_size=2, gradient_accumulation_steps=1, num_epochs=1, eval_strategy="no", seed=11
    )
    storage = tmp / "runs"
    params = dict(
        model=str(model),
        train_data=str(data),
        config=config,
        run_key=f"realsize-{arch}",
        storage=str(storage),
        checkpointing={"checkpoint_every": 1, "keep_checkpoints": None},
        execution={"cpu_threads": threads},
    )
    reference = run_flow(params, api_url)
    position, size = rewind_to_first_checkpoint(storage / params["run_key"])
    resumed = run_flow(params, api_url)
    if not position or resumed["summary"].get("resumed_from_batch") != position:
        raise RuntimeError(f"the second run did not resume from batch {position}: {resumed['summary']}")
    return {
        "arch": arch,
        "checkpoint_bytes": size,
        "reference_flow_s": reference["seconds"],
        "reference_flow_rss_mb": reference["rss_mb"],
        "resumed_flow_s": resumed["seconds"],
        "resumed_flow_rss_mb": resumed["rss_mb"],
        "flow_imported_torch": reference["torch"] or resumed["torch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="span")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    threads = int(os.environ.get("BENCH_THREADS", "2"))
    from support.prefect_harness import local_prefect_server

    rows = []
    with local_prefect_server() as api_url:
        for arch in args.arch.split(","):
            with tempfile.TemporaryDirectory(prefix="realsize-flow-", dir=os.environ.get("BENCH_TMP")) as tmp:
                rows.append(measure(arch, Path(tmp), api_url, threads))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}; {threads} worker threads")
    print(
        f"{'arch':9} {'ckpt GB':>7} {'flow s':>7} {'flow RSS MB':>11} {'resumed s':>9} {'resumed RSS MB':>14} "
        f"{'torch':>5}"
    )
    for r in rows:
        print(
            f"{r['arch']:9} {r['checkpoint_bytes'] / 1e9:7.2f} {r['reference_flow_s']:7.1f} "
            f"{r['reference_flow_rss_mb']:11.0f} {r['resumed_flow_s']:9.1f} {r['resumed_flow_rss_mb']:14.0f} "
            f"{'yes' if r['flow_imported_torch'] else 'no':>5}"
        )
    print("RSS: the flow process's peak (VmHWM) over its whole run; the worker is another process; target < 300 MB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
