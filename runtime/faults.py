"""Test-only fault injection at named points, driven by environment variables (a no-op unless they are set).

Points: ``batch`` (before the worker trains batch i), ``validate`` (before the validation after batch i),
``checkpoint`` (before the worker writes the checkpoint at batch i), ``checkpoint-write`` (its files complete,
not yet committed), ``export-write`` (export files complete, not yet renamed into place; i is the last batch;
on object storage both fire after each uploaded object, before the marker),
``cursor`` (in the flow process: checkpoint committed, cursor.json not yet moved), ``prune`` (in the flow process:
a pruned checkpoint's index deleted, its files not yet; i is its last batch), ``unit`` (in the flow
process, after the unit ending at batch i finished).

    PREFECT_GLINER2_TEST_MARKERS=DIR            on reaching a point, write DIR/<point>-<i> holding the pid
    PREFECT_GLINER2_TEST_PAUSE=point:i:secs,... sleep there (gives a test time to kill -9 the process)
    PREFECT_GLINER2_TEST_DIE=point:i:FILE,...   SIGKILL the current process there, once (FILE marks "done")
    PREFECT_GLINER2_TEST_RAISE=point:i:FILE,... raise RuntimeError there, once
    PREFECT_GLINER2_TEST_OSERROR=point:i:ENOSPC:FILE,...  raise OSError with that errno there, once

``i`` may be ``*`` (any index).
"""

from __future__ import annotations

import errno
import os
import signal
import time

ENV_MARKERS = "PREFECT_GLINER2_TEST_MARKERS"
ENV_PAUSE = "PREFECT_GLINER2_TEST_PAUSE"
ENV_DIE = "PREFECT_GLINER2_TEST_DIE"
ENV_RAISE = "PREFECT_GLINER2_TEST_RAISE"
ENV_OSERROR = "PREFECT_GLINER2_TEST_OSERROR"
_ALL = (ENV_MARKERS, ENV_PAUSE, ENV_DIE, ENV_RAISE, ENV_OSERROR)


def active() -> bool:
    return any(os.environ.get(name) for name in _ALL)


def hit(point: str, index: int) -> None:
    """Run whatever the environment asks for at (point, index); returns at once when nothing is set."""
    if not active():
        return
    markers = os.environ.get(ENV_MARKERS)
    if markers:
        path = os.path.join(markers, f"{point}-{index}")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    for argument in _matching(ENV_PAUSE, point, index):
        time.sleep(float(argument))
    for argument in _matching(ENV_DIE, point, index):
        if _first_time(argument):
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
    for argument in _matching(ENV_RAISE, point, index):
        if _first_time(argument):
            raise RuntimeError(f"injected transient failure at {point} {index} (test hook)")
    for argument in _matching(ENV_OSERROR, point, index):
        name, marker = argument.split(":", 1)
        if _first_time(marker):
            code = getattr(errno, name)
            raise OSError(code, f"{os.strerror(code)} (injected at {point} {index}, test hook)")


def _matching(env: str, point: str, index: int) -> list[str]:
    found = []
    for item in filter(None, os.environ.get(env, "").split(",")):
        name, at, argument = item.split(":", 2)
        if name == point and at in ("*", str(index)):
            found.append(argument)
    return found


def _first_time(marker_file: str) -> bool:
    try:
        fd = os.open(marker_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True
