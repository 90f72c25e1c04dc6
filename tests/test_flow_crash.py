"""kill -9 of the whole flow process at the worst moments, then resume: the result is bitwise the uninterrupted one.

Each crashed run is a fresh interpreter running train_flow against the shared test server with a fault plan
installed that pauses it at a named point and writes a marker; the test SIGKILLs the flow process there (its
session worker must die with it). Resumption happens by a new flow run with the same run key and by
``prefect flow-run retry`` of a crashed run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.session_core import layout

from support.config import training_config
from support.flow import (
    ROOT,
    assert_same_export,
    flow_child,
    make_space,
    reference_export,
    run_flow,
    space_params,
    wait_for_marker,
)
from support.processes import kill9, pid_gone

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("crash"))


def _crash_at(params: dict[str, Any], point: str, markers: Path, api_url: str) -> tuple[int, str]:
    """Run the flow in a subprocess, SIGKILL it when it reaches `point`; returns (pid at the point, output)."""
    markers.mkdir(parents=True)
    name, index = point.rsplit(":", 1)
    process = flow_child(params, FaultPlan((Fault.pause(name, int(index), 120),), markers=str(markers)), api_url)
    try:
        pid = wait_for_marker(markers, f"{name}-{index}", process)
    finally:
        output = kill9(process)
    return pid, output


def _cursor(run: Path) -> dict[str, Any]:
    return json.loads((run / "cursor.json").read_text())


def test_kill_9_of_the_flow_process_then_resume_is_exact(space: dict[str, Any], prefect_server: str) -> None:
    storage = space["root"] / "runs"
    run = storage / "crash-boundary"
    params = dict(
        model=space["boundary"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        run_key="crash-boundary",
        storage=str(storage),
        checkpointing={"checkpoint_every": 2},
    )
    # 12 batches, updates after odd batches, checkpoints after batches 3, 5 (epoch end), 7 and 11, validation 5, 11.
    worker, _ = _crash_at(params, "batch:7", space["root"] / "m1", prefect_server)  # mid-window: batch 6 pending
    assert pid_gone(worker), "the session worker outlived the killed flow process"
    assert _cursor(run)["checkpoint"] == "step-000003-batch-000005"

    worker, _ = _crash_at(
        params, "checkpoint-write:7", space["root"] / "m2", prefect_server
    )  # files written, not committed
    assert pid_gone(worker)
    debris = [p.name for p in (run / layout.CHECKPOINTS_DIR).iterdir() if layout.is_debris(p.name)]
    assert debris and not (run / "checkpoints" / "step-000004-batch-000007").exists()
    assert _cursor(run)["cursor"] == 6

    _crash_at(params, "cursor:7", space["root"] / "m3", prefect_server)  # committed, cursor.json not yet moved
    assert (run / "checkpoints" / "step-000004-batch-000007" / "checkpoint.json").exists()
    assert _cursor(run)["cursor"] == 6
    assert not any(layout.is_debris(p.name) for p in (run / layout.CHECKPOINTS_DIR).iterdir())

    worker, _ = _crash_at(params, "validate:11", space["root"] / "m4", prefect_server)  # mid-validation
    assert pid_gone(worker)
    assert _cursor(run)["checkpoint"] == "step-000004-batch-000007"  # the reused checkpoint moved the cursor

    worker, _ = _crash_at(params, "export-write:11", space["root"] / "m5", prefect_server)  # export half-done
    assert pid_gone(worker)
    assert _cursor(run)["finished"] and not (run / "export").exists()
    assert any(layout.is_debris(p.name, of=layout.EXPORT_DIR) for p in run.iterdir())

    summary = run_flow(**params)  # a new flow run with the same run key finishes the job
    assert summary["resumed_from_batch"] == 12 and not any(layout.is_debris(p.name) for p in run.iterdir())
    reference = reference_export(space["boundary"], space["inputs"], training_config(), space["root"] / "ref-boundary")
    assert_same_export(summary["export"], reference)


def test_prefect_flow_run_retry_of_a_crashed_run_resumes_exactly(space: dict[str, Any], prefect_server: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    cfg = training_config(use_lora=True)
    params = space_params(space, "crash-retry", config=cfg, checkpointing={"checkpoint_every": 1})
    worker, _ = _crash_at(params, "batch:8", space["root"] / "m6", prefect_server)
    assert pid_gone(worker)
    lease = json.loads((space["root"] / "runs" / "crash-retry" / ".lease").read_text())  # who held the run key
    flow_run_id = lease["flow_run_id"]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(UUID(flow_run_id)).state.is_running()  # type: ignore[union-attr]
        # What the server's heartbeat monitoring does after missed heartbeats; the retry re-runs this flow run.
        client.set_flow_run_state(UUID(flow_run_id), Crashed(message="killed by the test"), force=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "flow-run",
            "retry",
            flow_run_id,
            "--entrypoint",
            "prefect_gliner2.flows.train:train_flow",
        ],
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=prefect_server),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(UUID(flow_run_id)).state.is_completed()  # type: ignore[union-attr]
    export = space["root"] / "runs" / "crash-retry" / "export"
    reference = reference_export(space["span"], space["inputs"], cfg, space["root"] / "ref-span-lora")
    assert_same_export(str(export), reference)
