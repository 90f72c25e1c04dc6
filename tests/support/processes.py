"""Child processes in tests and the chaos engine: SIGKILL one and collect its output, wait until a pid is gone, check
that no spare session worker is left, run a served-deployments process for the length of a fixture."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from support.flow import ROOT

__all__ = ["assert_no_spare_left", "kill9", "pid_gone", "serving"]


def kill9(process: subprocess.Popen[str]) -> str:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGKILL)
    output, _ = process.communicate(timeout=60)
    return output or ""


def pid_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except (ProcessLookupError, OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def assert_no_spare_left(timeout: float = 10.0) -> None:
    """No spare session worker waits in this process, and none of its children is one (a discarded spare may take a
    moment to be reaped)."""
    from prefect_gliner2.runtime import spare

    assert spare.spare_pid() is None
    deadline = time.monotonic() + timeout
    while _spares() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _spares()


def _spares() -> list[str]:
    from prefect_gliner2.runtime import spare
    from prefect_gliner2.runtime.forkserver import forked_workers

    spawned = [p.name for p in multiprocessing.active_children()]
    return [name for name in [*spawned, *(name for name, _ in forked_workers())] if name == spare.SPARE_NAME]


@contextlib.contextmanager
def serving(command: list[str], env: dict[str, str], log_path: Path, timeout: float = 120) -> Iterator[None]:
    """Run `command` (a process that serves deployments) in its own process group, logging to `log_path`, until it
    says its deployments are being served; stop it on exit (SIGINT to the group, SIGKILL if it lingers)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            while "deployments are being served" not in log_path.read_text():
                if process.poll() is not None:
                    raise AssertionError(f"{command} exited with {process.returncode}:\n{log_path.read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{command} did not start serving within {timeout} s:\n{log_path.read_text()}")
                time.sleep(0.5)
            yield
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(10)  # Prefect's runner can sit out its shutdown after many runs: nothing is asserted here
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
