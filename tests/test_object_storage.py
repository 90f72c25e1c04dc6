"""Runs on object storage: a real S3 API server (moto, on loopback) behind s3fs, as a fleet would use it.

A run whose storage is ``s3://`` exports the same bits as a direct run, reports the disk it uses, keeps only the
checkpoints retention allows, and loading its export leaves no temporary copy behind. The chaos case kills the
whole run mid-upload of a checkpoint, while pruning and mid-upload of the export, then retries the killed flow run
at once with ``prefect flow-run retry``: it takes its own lease over and finishes with the uninterrupted bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import checkpoint_refs

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

ENTRYPOINT = "prefect_gliner2.flows.train:train_flow"


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("s3"))


def _download(uri: str, target: Path) -> str:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    fs.invalidate_cache()
    fs.get(f"{path.rstrip('/')}/", str(target), recursive=True)
    return str(target)


def test_a_run_on_s3_exports_the_reference_bits_and_keeps_bounded_checkpoints(
    space: dict[str, Any],
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    cfg = training_config()
    summary = run_flow(
        **space_params(
            space,
            "s3-span",
            config=cfg,
            storage=f"{s3_bucket}/runs",
            checkpointing={"checkpoint_every": 1, "keep_checkpoints": 2},
        )
    )
    assert summary["export"].startswith("s3://")
    reference = reference_export(space["span"], space["inputs"], cfg, space["root"] / "ref-span")
    assert_same_export(_download(summary["export"], tmp_path / "export"), reference)

    import fsspec

    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.invalidate_cache()
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/runs/s3-span/checkpoints", detail=False))
    kept = [name for name in listed if layout.parse_checkpoint_name(name)]  # (beside them: the blob store)
    # 6 updates, a checkpoint after each: the newest two plus the one taken at the best validation step survive
    best = f"step-{summary['best_step']:06d}-"
    assert summary["checkpoint"] in kept and 2 <= len(kept) <= 3, kept
    assert any(name.startswith(best) for name in kept), (best, kept)
    assert summary["checkpoints_kept"] == len(kept)
    stored = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/runs/s3-span/checkpoints/blobs", detail=False)}
    referenced = {
        ref.path.rsplit("/", 1)[-1]
        for name in kept
        for ref in checkpoint_refs(f"{s3_bucket}/runs/s3-span/checkpoints/{name}")
    }
    assert referenced and referenced <= stored  # best weights kept while a checkpoint refers to them
    assert summary["disk_bytes"] >= summary["checkpoint_bytes"] > 0


def test_loading_an_s3_export_leaves_no_temporary_copy(
    space: dict[str, Any],
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    import fsspec
    import torch

    from prefect_gliner2.training import load_exported_model

    local = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "ref-span")
    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.put(f"{local}/", f"{s3_bucket}/model", recursive=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    previous, tempfile.tempdir = tempfile.tempdir, str(scratch)
    try:
        model = load_exported_model(f"{s3_bucket}/model")
    finally:
        tempfile.tempdir = previous
    assert list(scratch.iterdir()) == [], "load_exported_model left a temporary copy"
    direct = load_exported_model(local)
    remote_state, local_state = model.state_dict(), direct.state_dict()
    assert sorted(remote_state) == sorted(local_state)
    assert all(torch.equal(remote_state[k], local_state[k]) for k in local_state)


def _crash_at(params: dict[str, Any], point: str, markers: Path, api_url: str, env: dict[str, str]) -> int:
    """Run the flow in a subprocess and SIGKILL it when it reaches `point`; returns the pid paused there."""
    markers.mkdir(parents=True)
    name, index = point.rsplit(":", 1)
    plan = FaultPlan((Fault.pause(name, int(index), 120),), markers=str(markers))
    process = flow_child(params, plan, api_url, env)
    try:
        return wait_for_marker(markers, f"{name}-{index}", process)
    finally:
        kill9(process)


def test_kills_during_uploads_and_pruning_on_s3_then_an_immediate_flow_run_retry_resume_exactly(
    space: dict[str, Any],
    s3_bucket: str,
    prefect_server: str,
    tmp_path: Path,
) -> None:
    import fsspec
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from prefect_gliner2.runtime.rundir import RunDirectory

    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    params = dict(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        run_key="s3-chaos",
        storage=f"{s3_bucket}/runs",
        checkpointing={"checkpoint_every": 1, "keep_checkpoints": 1},
    )
    run_dir = RunDirectory(f"{s3_bucket}/runs", "s3-chaos")
    fs, _ = fsspec.core.url_to_fs(s3_bucket)

    def listing(*parts: str) -> list[str]:
        fs.invalidate_cache()
        path = "/".join([run_dir.path, *parts])
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) if fs.exists(path) else []

    # 1. killed mid-upload of a checkpoint: some objects written, no index
    worker = _crash_at(params, "checkpoint-write:5", tmp_path / "m1", prefect_server, env)
    assert pid_gone(worker)
    assert "step-000003-batch-000005" in run_dir.uncommitted_checkpoints()
    assert run_dir.read_cursor().checkpoint == "step-000002-batch-000003"  # type: ignore[union-attr]

    # 2. killed while pruning (the pruned checkpoint's index gone, its files not yet): nothing needed is lost
    plan = FaultPlan((Fault.kill("prune", None, once=str(tmp_path / "died")),))
    died = flow_child(params, plan, prefect_server, env)
    died.communicate(timeout=300)
    assert died.returncode == -9
    cursor = run_dir.read_cursor().checkpoint  # type: ignore[union-attr]
    assert cursor == "step-000003-batch-000005"
    uncommitted = run_dir.uncommitted_checkpoints()
    assert "step-000002-batch-000003" in uncommitted  # half-pruned: its index gone, its files not yet
    # with the default pipelining the worker may already be writing the next checkpoint when the flow prunes:
    # anything else uncommitted lies after the cursor (in flight), never at or before it
    assert all(name > cursor for name in uncommitted if name != "step-000002-batch-000003"), uncommitted

    # 3. killed mid-upload of the export: a partial export with its pending marker, a local staging copy in TMPDIR
    worker = _crash_at(params, "export-write:11", tmp_path / "m3", prefect_server, env)
    assert pid_gone(worker)
    assert ".pending.json" in listing("export") and "export.json" not in listing("export")
    assert any(p.name.startswith("prefect-gliner2-upload-") for p in temp.iterdir())
    claims = listing(".lease.d")
    assert len(claims) == 1  # the killed run's claim, still fresh: the retry must not wait out its TTL
    flow_run_id = json.loads(fs.cat_file(f"{run_dir.path}/.lease.d/{claims[0]}"))["flow_run_id"]

    # 4. at once: `prefect flow-run retry` of the killed run (marked CRASHED as the lost-run automation does)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(UUID(flow_run_id), Crashed(message="killed by the test"), force=True)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", flow_run_id, "--entrypoint", ENTRYPOINT],
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=prefect_server, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RunLockedError" not in done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(UUID(flow_run_id)).state.is_completed()  # type: ignore[union-attr]
    assert time.monotonic() - started < 60 + 120  # no TTL wait on top of the run itself
    reference = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "ref-span")
    assert_same_export(_download(f"{run_dir.uri}/export", tmp_path / "export"), reference)
    assert ".pending.json" not in listing("export") and "export.json" in listing("export")
    assert run_dir.uncommitted_checkpoints() == []
    assert listing(".lease.d") == []
    assert [p.name for p in temp.iterdir() if p.name.startswith("prefect-gliner2-")] == []


def test_the_prefect_api_decides_whether_a_lease_holder_is_gone() -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    from prefect_gliner2.flows.context import holder_flow_run_gone

    @flow(name="lease-holder")
    def holder() -> None:
        return None

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(holder)
        client.set_flow_run_state(run.id, Running(), force=True)
        assert holder_flow_run_gone({"flow_run_id": str(run.id)}) is None  # running: not provably gone
        client.set_flow_run_state(run.id, Crashed(message="host lost"), force=True)
    assert "is Crashed per the Prefect API" in str(holder_flow_run_gone({"flow_run_id": str(run.id)}))
    assert holder_flow_run_gone({"flow_run_id": None}) is None
