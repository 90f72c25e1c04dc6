"""Ctrl-C and SIGTERM under a person's hands: real signals to the CLI's real process group, on the embedded default
(no PREFECT_API_URL: the local server the command starts) and against a separate server. The command ends within
5 s with the resume hint and 128 + the signal, no traceback; the run is CRASHED, never left RUNNING; the worker and
the local server end too; re-running resumes to the same weights as an uninterrupted run. Also: the first screen on
a fresh PREFECT_HOME, and the local server starting while the cores are kept busy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_gliner2.flows.cli.interrupts import RESUME_HINT
from prefect_gliner2.flows.cli.server import local_server
from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.config import training_config
from support.flow import ROOT, assert_same_export, make_inputs, reference_export, wait_for_marker
from support.processes import pid_gone

INTERRUPT_SECONDS = 5.0  # from the signal to the command's exit
PACE_SECONDS = 0.4  # each batch after a signal's marker: the run cannot end before a starved test process signals

_CLI = (
    "import sys; from prefect_gliner2.runtime import faults; "
    "faults.install(faults.FaultPlan.from_json(sys.argv[1])); "
    "from prefect_gliner2.flows.cli import console_main; console_main(sys.argv[2:])"
)
_FIRST_SCREEN_NOISE = ("Traceback", "database is locked", "to instantiate a model of type", "Error logging to API")


def _paced_after(index: int, n_batches: int = 24) -> tuple[Fault, ...]:
    """A short pause at every batch after `index`: the run still trains when the signal lands (a tiny batch takes
    ~0.05 s, so without this a busy CI host's test process, waking late, found the run already done: exit 0)."""
    return tuple(Fault.pause("batch", i, PACE_SECONDS) for i in range(index + 1, n_batches))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("interrupts")
    inputs = make_inputs(root / "data", n_train=24)  # 24 batches: a signal after a marker lands mid-training
    (root / "config.json").write_text(json.dumps(training_config()))
    return {"root": str(root), "config": str(root / "config.json"), **inputs}


class Command:
    """One `prefect-gliner2 train` in its own process group (as a terminal runs it), output to files."""

    def __init__(self, files: dict[str, str], env: dict[str, str], plan: FaultPlan, out: Path, run_key: str) -> None:
        argv = ["train", "--model", "tiny:span", "--train", files["train"], "--valid", files["valid"]]
        argv += ["--config", files["config"], "--run-key", run_key, "--storage", os.path.join(files["root"], "runs")]
        argv += ["--export", str(out / "model"), "--checkpoint-every", "2", "--cpu-threads", "1"]
        self.out, self.err = out / "stdout.txt", out / "stderr.txt"
        with open(self.out, "w") as stdout, open(self.err, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CLI, plan.to_json(), *argv],
                cwd=str(ROOT),
                env=env,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    def interrupt(self, sig: int) -> tuple[int, float, list[int]]:
        """Send `sig` to the command's process group; returns (exit status, seconds to exit, descendant pids)."""
        descendants = _descendants(self.process.pid)
        sent = time.monotonic()
        os.killpg(self.process.pid, sig)
        try:
            code = self.process.wait(60)
        finally:
            _kill_group(self.process.pid)
        return code, time.monotonic() - sent, descendants

    def finish(self, timeout: float = 300) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            _kill_group(self.process.pid)

    def stderr(self) -> str:
        return self.err.read_text()

    def flow_run_id(self) -> str:
        found = re.search(r"/flow-run/([0-9a-f-]{36})", self.stderr())
        assert found, f"no flow run link in the output:\n{self.stderr()[-3000:]}"
        return found.group(1)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _env(home: Path, api_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PYTHONPATH=str(ROOT))
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _states(api_url: str) -> dict[str, str]:
    """Flow run id -> state type, of every gliner2-train flow run recorded by the server at `api_url`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["gliner2-train"])))
    return {str(run.id): run.state_type.value if run.state_type else "" for run in runs}


def _assert_interrupted(command: Command, outcome: tuple[int, float, list[int]], sig: int) -> None:
    code, seconds, descendants = outcome
    err = command.stderr()
    assert code == 128 + sig, f"exit status {code}:\n{err[-3000:]}"
    assert seconds < INTERRUPT_SECONDS, f"took {seconds:.1f} s to end after {signal.Signals(sig).name}"
    print(f"{signal.Signals(sig).name}: the command ended {seconds:.2f} s after the signal")
    assert RESUME_HINT in err and "Traceback" not in err and "Error logging to API" not in err, err[-3000:]
    assert descendants, "the command had no worker process"
    lingering = [pid for pid in descendants if not pid_gone(pid, timeout=10)]
    assert not lingering, f"processes left behind by the command: {lingering}"


def test_ctrl_c_and_sigterm_on_the_embedded_default(files: dict[str, str], tmp_path: Path) -> None:
    """No PREFECT_API_URL, fresh PREFECT_HOME: Ctrl-C while the worker is busy in a batch, then SIGTERM while it
    trains, then a run to the end: 130, 143, both runs CRASHED in the local database, the same weights as an
    uninterrupted run. The first screen has no traceback and no warning that is not about the run."""
    home, markers = tmp_path / "prefect-home", tmp_path / "markers"
    markers.mkdir()
    env = _env(home, None)
    plan = FaultPlan(
        (Fault.pause("batch", 9, 120, once=str(markers / "once-9")), Fault.pause("batch", 14, 0), *_paced_after(14)),
        markers=str(markers),
    )
    ctrl_c = Command(files, env, plan, _mkdir(tmp_path / "a"), "default")
    wait_for_marker(markers, "batch-9", ctrl_c.process, timeout=240)
    _assert_interrupted(ctrl_c, ctrl_c.interrupt(signal.SIGINT), signal.SIGINT)
    first_screen = ctrl_c.stderr()
    assert not [noise for noise in _FIRST_SCREEN_NOISE if noise in first_screen], first_screen[:4000]
    assert "database is locked" not in (home / "prefect-gliner2-server.log").read_text()

    sigterm = Command(files, env, plan, _mkdir(tmp_path / "b"), "default")
    wait_for_marker(markers, "batch-14", sigterm.process, timeout=240)
    _assert_interrupted(sigterm, sigterm.interrupt(signal.SIGTERM), signal.SIGTERM)
    assert "resuming run default from checkpoint" in sigterm.stderr()

    resumed = Command(files, env, FaultPlan(()), _mkdir(tmp_path / "c"), "default")
    assert resumed.finish() == 0, resumed.stderr()[-3000:]
    assert "Traceback" not in resumed.stderr()
    reference = reference_export("tiny:span", files, training_config(), tmp_path / "reference")
    assert_same_export(str(tmp_path / "c" / "model"), reference)
    with local_server(str(home)) as url:
        states = _states(url)
    assert states == {
        ctrl_c.flow_run_id(): "CRASHED",
        sigterm.flow_run_id(): "CRASHED",
        resumed.flow_run_id(): "COMPLETED",
    }


def test_sigterm_against_a_separate_server(prefect_server: str, files: dict[str, str], tmp_path: Path) -> None:
    """PREFECT_API_URL set: the same interrupt behaviour; the run is CRASHED on that server."""
    markers = tmp_path / "markers"
    markers.mkdir()
    plan = FaultPlan((Fault.pause("batch", 5, 0), *_paced_after(5)), markers=str(markers))
    command = Command(files, _env(tmp_path / "home", prefect_server), plan, _mkdir(tmp_path / "a"), "separate")
    wait_for_marker(markers, "batch-5", command.process, timeout=240)
    _assert_interrupted(command, command.interrupt(signal.SIGTERM), signal.SIGTERM)
    assert _states(prefect_server)[command.flow_run_id()] == "CRASHED"


def test_the_local_server_starts_on_a_busy_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy process on every core, and Prefect's ephemeral start-up timeout at 1 s (its default, 20 s, is what a
    busy machine outlasted): the local server still starts and answers. (One per core, not more: the other pytest
    process shares these cores, and each extra busy process slows every test running beside this one.)"""
    import httpx

    cores = len(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(cores)]
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "1")
    try:
        started = time.monotonic()
        with local_server(str(tmp_path / "home")) as url:
            seconds = time.monotonic() - started
            assert httpx.get(f"{url}/health", timeout=30).json() is True
            assert _states(url) == {}
        print(f"local server started in {seconds:.1f} s with {cores} busy processes")
    finally:
        for process in busy:
            process.kill()
            process.wait()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
