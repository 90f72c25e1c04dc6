"""Child processes in tests and the chaos engine: SIGKILL one and collect its output, wait until a pid is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

__all__ = ["kill9", "pid_gone"]


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
