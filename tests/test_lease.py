"""The run-key lease (runtime/lease.py): a local flock that only its holder's death releases, and a remote record
with heartbeat and TTL on fsspec memory storage. No model, no worker, no Prefect server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from prefect_gliner2.runtime.errors import RunLockedError
from prefect_gliner2.runtime.lease import CLAIMS_DIR, RunLease
from prefect_gliner2.runtime.rundir import RunDirectory

from support.processes import pid_gone


def _local(tmp_path: Path, key: str = "leased") -> RunDirectory:
    run_dir = RunDirectory(str(tmp_path), key)
    run_dir.create()
    return run_dir


def _remote(key: str = "remote") -> RunDirectory:
    run_dir = RunDirectory(f"memory://leases-{uuid.uuid4().hex}", key)
    run_dir.create()
    return run_dir


def test_local_lease_survives_nothing_but_its_holder(tmp_path: Path) -> None:
    run_dir = _local(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from prefect_gliner2.runtime.lease import RunLease; "
            "from prefect_gliner2.runtime.rundir import RunDirectory; "
            f"RunLease(RunDirectory({str(tmp_path)!r}, 'leased'), flow_run_id='holder').acquire(); "
            "print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError, match=f"pid {holder.pid} .*flow run holder"):
        RunLease(run_dir, wait=0).acquire()
    holder.kill()  # kill -9: the kernel drops the flock
    holder.wait(10)
    assert pid_gone(holder.pid)
    with RunLease(run_dir) as lease:
        assert lease.held


def test_local_lease_is_exclusive_even_within_one_process_and_records_its_holder(tmp_path: Path) -> None:
    run_dir = _local(tmp_path)
    first = RunLease(run_dir, flow_run_id="one")
    first.acquire()
    first.acquire()  # idempotent for its holder
    record = json.loads((tmp_path / "leased" / ".lease").read_text())
    assert (record["pid"], record["flow_run_id"], record["owner"]) == (os.getpid(), "one", first.owner["owner"])
    with pytest.raises(RunLockedError) as refused:
        RunLease(run_dir, flow_run_id="two", wait=0).acquire()
    message = str(refused.value)
    assert f"run key 'leased' is in use by another live run (pid {os.getpid()} on " in message
    assert "flow run one" in message and "choose a different run key" in message
    first.release()
    first.release()  # idempotent
    assert not first.held
    with RunLease(run_dir, flow_run_id="two") as second:
        assert second.held
        assert json.loads((tmp_path / "leased" / ".lease").read_text())["flow_run_id"] == "two"
    assert not second.held


def test_local_lease_is_released_when_the_block_raises(tmp_path: Path) -> None:
    run_dir = _local(tmp_path)
    with pytest.raises(ValueError, match="inside"), RunLease(run_dir):
        raise ValueError("inside")
    with RunLease(run_dir) as again:
        assert again.held


def test_remote_lease_record_with_heartbeat_and_ttl() -> None:
    run_dir = _remote()
    first = RunLease(run_dir, flow_run_id="one", ttl=0.6)
    first.acquire()
    with pytest.raises(RunLockedError, match="flow run one.*expires at"):
        RunLease(run_dir, ttl=0.6, wait=0).acquire()
    time.sleep(1.0)  # the heartbeat keeps renewing it
    with pytest.raises(RunLockedError):
        RunLease(run_dir, ttl=0.6, wait=0).acquire()
    first._stop.set()  # the holder "dies": no more heartbeats
    time.sleep(1.0)
    second = RunLease(run_dir, flow_run_id="two", ttl=0.6, wait=0)
    second.acquire()  # the stale lease is taken over
    assert second.took_over and "TTL" in second.took_over[0]
    with pytest.raises(RunLockedError, match="taken over"):
        first.check()
    second.release()


def test_remote_release_removes_only_its_own_claim() -> None:
    run_dir = _remote()
    folder = f"{run_dir.path}/{CLAIMS_DIR}"
    first = RunLease(run_dir, flow_run_id="one", ttl=0.6, wait=0)
    first.acquire()
    first.check()  # held and not lost: nothing to raise
    [claim] = [json.loads(run_dir.fs.cat_file(path)) for path in run_dir.fs.ls(folder, detail=False)]
    assert (claim["owner"], claim["flow_run_id"], claim["ttl"], claim["held"]) == (
        first.owner["owner"],
        "one",
        0.6,
        True,
    )
    first._stop.set()  # stale after its TTL
    time.sleep(0.8)
    second = RunLease(run_dir, flow_run_id="two", ttl=0.6, wait=0)
    second.acquire()
    first.release()  # removes its own claim only: the taker's stays
    owners = [json.loads(run_dir.fs.cat_file(path))["owner"] for path in run_dir.fs.ls(folder, detail=False)]
    assert owners == [second.owner["owner"]]
    second.release()
    assert not run_dir.fs.exists(folder) or run_dir.fs.ls(folder, detail=False) == []
    with RunLease(run_dir, ttl=0.6, wait=0) as third:  # free again
        assert third.held
