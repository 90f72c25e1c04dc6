"""Local temporary copies (``$TMPDIR/prefect-gliner2-<kind>-<pid>-*``) and whether the process that made one lives.

A remote commit or model load stages files in such a copy; a kill leaves it behind, and ``clean_stale_temp`` removes
the copies whose process is provably gone. ``process_alive`` / ``process_start`` also tell a run lease held by a dead
process on this host (``runtime.lease``). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["TEMP_PREFIX", "clean_stale_temp", "process_alive", "process_start"]

TEMP_PREFIX = "prefect-gliner2-"


def clean_stale_temp() -> list[str]:
    """Remove temp copies (``prefect-gliner2-<kind>-<pid>-*``) whose process is gone: left by a kill."""
    removed = []
    for entry in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*-*"):
        parts = entry.name[len(TEMP_PREFIX) :].split("-")
        if len(parts) < 3 or not parts[1].isdigit() or process_alive(int(parts[1])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    return removed


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: Any, start: Any = None) -> bool:
    """False only when process `pid` is provably gone on this host: no such pid, a zombie, or a pid reused by a
    process started at another time than `start` (from ``process_start``); True when it cannot tell."""
    if not isinstance(pid, int):
        return True  # cannot tell: not provably gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False  # a zombie: dead, not yet reaped
    except (OSError, IndexError):
        pass
    current = process_start(pid)
    return start is None or current is None or current == start
