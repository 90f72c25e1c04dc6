"""The embedded default: with no Prefect API configured, ``train`` and ``demo`` run against a Prefect server that
the command starts itself, on loopback, and stops when it ends.

    with prefect_api() as url:      # the configured PREFECT_API_URL, else a local server started here
        train_flow(...)

Why not Prefect's own ephemeral server: it runs in the terminal's process group, so a Ctrl-C (or a SIGTERM to the
group) kills it together with the command, which then cannot record the interrupted run (it retries for minutes
and leaves the run RUNNING); and it gives up after Prefect's ephemeral start-up timeout, which a busy machine
outlasts. The local server here is ``prefect server start`` (the same database under ``PREFECT_HOME``) in its own
session, so terminal signals reach only the command, which records the run as crashed and then stops the server.
It dies with the command if the command is killed (Linux parent-death signal), and the start-up wait is as long as
the server process is alive (``START_TIMEOUT`` at most). It serves the Prefect UI while the command runs (the flow
run's "View at" link). Prefect's telemetry is off for it, as are the scheduler and late-run services (nothing is
scheduled on it); its output goes to ``PREFECT_HOME/prefect-gliner2-server.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from prefect_gliner2.flows.prefect_compat import drain_queued

__all__ = ["START_TIMEOUT", "LocalServerError", "local_server", "prefect_api"]

START_TIMEOUT = 900.0  # seconds; a server that is still starting is waited for this long
_STOP_GRACE = 2.0  # seconds a stopping server gets before SIGKILL (its SQLite database is crash-safe)
_NOTICE_AFTER = 15.0  # seconds of start-up after which the wait is explained once
_POLL = 0.05  # seconds between health checks while the server starts (its readiness gates the first batch)
_NOTICE = "waiting for the local Prefect server (a first start creates its database; a busy machine is slower) ..."
_SERVER_SETTINGS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
}
# Sets the parent-death signal, makes sure the parent is still there, then becomes `prefect server start`.
_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(70)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'prefect', 'server', 'start', *sys.argv[2:]])\n"
)


class LocalServerError(RuntimeError):
    """The local Prefect server did not start."""


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """Yield the Prefect API URL flows of this process use: PREFECT_API_URL when configured, else the URL of a
    local server started for the duration of the block (and set as this process's PREFECT_API_URL)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    configured = PREFECT_API_URL.value()
    if configured:
        yield str(configured)
        return
    with local_server() as url, temporary_settings(updates={PREFECT_API_URL: url}):
        try:
            yield url
        finally:
            drain_queued()


@contextlib.contextmanager
def local_server(home: str | None = None, timeout: float = START_TIMEOUT) -> Iterator[str]:
    """Start ``prefect server start`` on a free loopback port in its own session with its database under `home`
    (default: this process's PREFECT_HOME), wait until it answers, yield its API URL; stop it on exit."""
    from prefect.settings import PREFECT_HOME

    home_dir = Path(home or PREFECT_HOME.value()).expanduser()
    home_dir.mkdir(parents=True, exist_ok=True)
    log_path = home_dir / "prefect-gliner2-server.log"
    process, url = _start(home_dir, log_path, timeout)
    try:
        yield url
    finally:
        _stop(process)


def _start(home: Path, log_path: Path, timeout: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server (a new port when the chosen one was taken meanwhile) and wait until it is ready."""
    for attempt in range(3):
        port = _free_port()
        env = {**os.environ, **_SERVER_SETTINGS, "PREFECT_HOME": str(home)}
        env.pop("PREFECT_API_URL", None)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, str(os.getpid()), "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}/api"
        try:
            if _wait_ready(process, url, timeout):
                return process, url
        except BaseException:
            _stop(process)
            raise
        if attempt < 2 and "already in use" in log_path.read_text(errors="replace"):
            continue
        break
    _stop(process)
    tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-20:])
    raise LocalServerError(
        f"the local Prefect server (PREFECT_HOME={home}) did not start: {_how(process, timeout)}; its log "
        f"({log_path}) ends with:\n{tail}\nset PREFECT_API_URL to use a Prefect server you run yourself"
    )


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout: float) -> bool:
    """True once the server answers its health check; False when it exited or `timeout` passed."""
    import httpx

    started = time.monotonic()
    noticed = False
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() - started < timeout:
            if process.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return True
            if not noticed and time.monotonic() - started > _NOTICE_AFTER:
                print(_NOTICE, file=sys.stderr, flush=True)
                noticed = True
            time.sleep(_POLL)
    return False


def _how(process: subprocess.Popen[bytes], timeout: float) -> str:
    code = process.poll()
    return f"it did not answer within {timeout:.0f} s" if code is None else f"it exited with status {code}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after a short grace period."""
    for sig, grace in ((signal.SIGTERM, _STOP_GRACE), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
