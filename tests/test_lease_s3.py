"""The run-key lease on object storage (a real S3 API server): who may take it over, how long others wait, and that
two racing runs never both hold it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from prefect_gliner2.runtime.errors import LeaseUnreadableError, RunLockedError
from prefect_gliner2.runtime.lease import RunLease
from prefect_gliner2.runtime.rundir import RunDirectory

from support.flow import ROOT


def _run_dir(bucket: str, key: str = "leased") -> RunDirectory:
    run_dir = RunDirectory(f"{bucket}/runs", key)
    run_dir.create()
    return run_dir


def _holder_process(bucket: str, key: str, flow_run_id: str) -> subprocess.Popen[str]:
    code = (
        "import time; from prefect_gliner2.runtime.lease import RunLease; "
        "from prefect_gliner2.runtime.rundir import RunDirectory; "
        f"RunLease(RunDirectory({bucket + '/runs'!r}, {key!r}), flow_run_id={flow_run_id!r}).acquire(); "
        "print('held', flush=True); time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=str(ROOT), stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_killed_holder_on_this_host_is_taken_over_at_once(s3_bucket: str) -> None:
    run_dir = _run_dir(s3_bucket)
    holder = _holder_process(s3_bucket, "leased", "first")
    try:
        with pytest.raises(RunLockedError, match=f"pid {holder.pid} .*flow run first.*expires at .* UTC"):
            RunLease(run_dir, wait=0).acquire()
    finally:
        holder.kill()
        holder.wait(10)
    started = time.monotonic()
    lease = RunLease(run_dir, flow_run_id="second", wait=0)
    lease.acquire()  # no waiting for the 60 s TTL: the holder's pid is gone from this host
    assert time.monotonic() - started < 10
    assert lease.took_over and f"process {holder.pid} on this host is gone" in lease.took_over[0]
    lease.release()


def test_a_retry_of_the_same_flow_run_takes_its_own_lease_over(s3_bucket: str) -> None:
    run_dir = _run_dir(s3_bucket)
    crashed = RunLease(run_dir, flow_run_id="retried")
    crashed.acquire()
    crashed._stop.set()  # its process "crashed" while this one lives on: only the flow run id can tell
    retry = RunLease(run_dir, flow_run_id="retried", wait=0)
    retry.acquire()
    assert "an earlier attempt of this same flow run" in retry.took_over[0]
    with pytest.raises(RunLockedError, match="taken over"):
        crashed.check()
    retry.release()


def test_a_holder_whose_flow_run_is_gone_is_taken_over_else_the_wait_is_bounded(
    s3_bucket: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_dir = _run_dir(s3_bucket)
    holder = _holder_process(s3_bucket, "leased", "elsewhere")
    try:
        live = RunLease(run_dir, flow_run_id="other", wait=1.5, holder_gone=lambda claim: None)
        started = time.monotonic()
        with caplog.at_level("WARNING"), pytest.raises(RunLockedError, match="waited 2 s .*lease_wait"):
            live.acquire()
        assert 1.5 <= time.monotonic() - started < 10
        assert "its lease expires at" in caplog.text and "waiting up to" in caplog.text
        asked: list[str] = []

        def gone(claim: dict[str, object]) -> str | None:
            asked.append(str(claim["flow_run_id"]))
            return "its flow run elsewhere is CRASHED per the Prefect API"

        # a holder on another host cannot be checked by pid; the Prefect API decides (the holder's pid is alive)
        lease = RunLease(run_dir, flow_run_id="other", wait=0, holder_gone=gone)
        lease.owner["host"] = "another-host"
        lease.acquire()
        assert asked == ["elsewhere"] and "CRASHED" in lease.took_over[0]
        lease.release()
    finally:
        holder.kill()
        holder.wait(10)


def test_an_unreadable_lease_is_an_error_never_free(s3_bucket: str) -> None:
    run_dir = _run_dir(s3_bucket)
    run_dir.fs.pipe_file(f"{run_dir.path}/.lease.d/garbled.json", b"{not json")
    with pytest.raises(LeaseUnreadableError, match="never taken as free"):
        RunLease(run_dir, wait=0).acquire()


RACER = """
import json, pathlib, sys, time
from prefect_gliner2.runtime.errors import RunLockedError
from prefect_gliner2.runtime.lease import RunLease
from prefect_gliner2.runtime.rundir import RunDirectory
storage, sync, trials, name = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def wait_for(*names):
    deadline = time.monotonic() + 100
    while not all((sync / n).exists() for n in names):
        assert time.monotonic() < deadline, f"{name}: {names} did not appear"
        time.sleep(0.02)

(sync / f"ready-{name}").touch()
wait_for("start")  # written by the test once both interpreters are up: a start time just ahead
start = float((sync / "start").read_text())
held = []
for trial in range(trials):
    time.sleep(max(0.0, start + trial * 0.8 - time.time()))
    lease = RunLease(RunDirectory(storage, f"race-{trial}"), flow_run_id=f"{name}-{trial}", wait=0)
    try:
        lease.acquire()
    except RunLockedError:
        print(json.dumps([trial, "refused"]), flush=True)
        continue
    print(json.dumps([trial, "held"]), flush=True)
    held.append(lease)
# every lease won is held until both racers are done: a late racer meets a live holder, never a released key
(sync / f"done-{name}").touch()
wait_for("done-a", "done-b")
for lease in held:
    lease.release()
"""


def test_two_runs_racing_for_one_key_never_both_hold_it(s3_bucket: str, tmp_path: Path) -> None:
    trials = 12
    script, sync = tmp_path / "racer.py", tmp_path / "sync"
    script.write_text(RACER)
    sync.mkdir()
    for trial in range(trials):
        _run_dir(s3_bucket, f"race-{trial}")
    racers = [
        subprocess.Popen(
            [sys.executable, str(script), f"{s3_bucket}/runs", str(sync), str(trials), name],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for name in ("a", "b")
    ]
    deadline = time.monotonic() + 180
    while not all((sync / f"ready-{name}").exists() for name in ("a", "b")):  # both interpreters are up
        assert all(racer.poll() is None for racer in racers) and time.monotonic() < deadline, "a racer did not start"
        time.sleep(0.02)
    (sync / "start.tmp").write_text(str(time.time() + 0.5))
    (sync / "start.tmp").rename(sync / "start")
    outcomes: dict[int, list[str]] = {trial: [] for trial in range(trials)}
    for racer in racers:
        out, _ = racer.communicate(timeout=120)
        assert racer.returncode == 0
        for line in out.splitlines():
            trial, outcome = json.loads(line)
            outcomes[trial].append(outcome)
    both = [t for t, found in outcomes.items() if found.count("held") > 1]
    assert not both, f"trials where both racers held the lease: {both}"
    assert all(sorted(found) == ["held", "refused"] for found in outcomes.values()), outcomes


def test_lease_claims_live_under_the_run_directory(s3_bucket: str) -> None:
    run_dir = _run_dir(s3_bucket, f"layout-{uuid.uuid4().hex[:6]}")
    with RunLease(run_dir, flow_run_id="x") as lease:
        claims = run_dir.fs.ls(f"{run_dir.path}/.lease.d", detail=False)
        assert [c.rsplit("/", 1)[-1] for c in claims] == [f"{lease.owner['owner']}.json"]
        assert json.loads(run_dir.fs.cat_file(claims[0]))["held"] is True
    run_dir.fs.invalidate_cache()
    assert not run_dir.fs.exists(f"{run_dir.path}/.lease.d/{lease.owner['owner']}.json")
