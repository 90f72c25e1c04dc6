"""The run lifecycle below the flows (runtime.prepare / runtime.run) without Prefect: a plain process prepares, opens,
drives and finishes a run, keeps the worker for a retry after a transient failure, and turns a full disk into a
StorageFullError, with neither prefect nor torch imported in that process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.config import training_config
from support.flow import ROOT, assert_same_export, make_inputs, reference_export, tiny_model_dir

_SCRIPT = """
import errno, json, sys
from prefect_gliner2.runtime import live_runs
from prefect_gliner2.runtime.errors import StorageFullError, WorkerDied
from prefect_gliner2.runtime.prepare import prepare_run
from prefect_gliner2.runtime.protocol import Advance
from prefect_gliner2.runtime.run import RunHooks, RunOptions, finish, open_run
from prefect_gliner2.session_core import TrainingConfig

model, train, valid, storage, config = sys.argv[1:6]
prepared = prepare_run(model, train, valid, TrainingConfig.from_dict(json.loads(config)), "plain", storage)
options = RunOptions(cpu_threads=1, lease_wait=0)
retried = RunHooks(flow_run_id="attempt", retry_follows=lambda: True)
try:  # a transient failure with a retry to follow: the worker stays alive and registered, the lease is released
    with open_run(prepared, options, retried) as run:
        run.worker.call(Advance(first=0, through=2))
        first_pid = run.worker.pid
        raise WorkerDied("injected")
except WorkerDied:
    kept = live_runs.lookup("plain") is not None and live_runs.lookup("plain").worker.alive
with open_run(prepared, options, retried) as run:  # the retry reuses that worker and finishes the plan
    reused = run.worker.pid == first_pid
    summary, cursor = finish(run)
after = live_runs.lookup("plain")
failed = []
hooks = RunHooks(on_failed=lambda run_dir, exc: failed.append(f"{run_dir.run_key}: {type(exc).__name__}"))
try:  # a permanent storage error: announced, the worker closed, raised as StorageFullError
    with open_run(prepared, options, hooks) as run:
        raise OSError(errno.ENOSPC, "No space left on device")
except StorageFullError as exc:
    full = str(exc)
print(json.dumps({
    "summary": summary, "cursor": cursor is None, "kept": kept, "reused": reused, "after": after is None,
    "failed": failed, "full": full, "unregistered": live_runs.lookup("plain") is None,
    "heavy": sorted(m for m in ("prefect", "torch") if m in sys.modules),
}))
"""


def test_a_plain_process_opens_drives_and_finishes_a_run_without_prefect(tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path / "data", n_train=8, n_valid=2)
    model, cfg = tiny_model_dir(tmp_path, "span"), training_config(num_epochs=1)
    storage = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, model, inputs["train"], inputs["valid"], str(storage), json.dumps(cfg)],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], "the lifecycle imported prefect or torch into the calling process"
    assert result["kept"] and result["reused"], "a retry after a transient failure reuses the live worker"
    assert result["after"] and result["unregistered"], "finishing (or failing for good) closes the worker"
    assert result["failed"] == ["plain: OSError"] and "No space left on device" in result["full"]
    summary = result["summary"]
    assert result["cursor"], "no checkpoint was committed: the durable cursor is still absent"
    assert (summary["run_key"], summary["flow_run_id"], summary["worker_starts"]) == ("plain", "attempt", 1)
    assert summary["export"] == str(storage / "plain" / "export") and summary["resumed_from_batch"] == 0
    assert summary["total_steps"] == 2 and summary["label"] == "best"
    reference = reference_export(model, inputs, cfg, tmp_path / "direct")
    assert_same_export(summary["export"], reference)
