"""A real MLflow tracking server for the suite: ``mlflow server`` in its own process on a free loopback port, a
SQLite backend store and a local artifact destination in a temporary directory, stopped (and removed) at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support.services import _stop, _wait_http, free_port

__all__ = ["MlflowServer", "mlflow_server"]


class MlflowServer:
    """A started ``mlflow server``; ``uri`` waits (once) until it answers ``/health``."""

    def __init__(self, process: subprocess.Popen[bytes], address: str, timeout: float) -> None:
        self.process, self.address, self.timeout, self.ready = process, address, timeout, False

    @property
    def uri(self) -> str:
        if not self.ready:
            _wait_http(f"{self.address}/health", self.process, self.timeout)
            self.ready = True
        return self.address


@contextlib.contextmanager
def mlflow_server(timeout: float = 300.0) -> Iterator[MlflowServer]:
    """Start ``mlflow server`` (one worker) at once and yield it; its ``uri`` waits until it answers (so its
    start-up, tens of seconds on a busy machine, overlaps whatever the caller starts meanwhile)."""
    root = Path(tempfile.mkdtemp(prefix="mlflow-server-"))
    port = free_port()
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
            ],
            cwd=str(root),
            # no job runner: MLflow 3 starts about ten huey consumer processes for its GenAI jobs otherwise
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield MlflowServer(process, f"http://127.0.0.1:{port}", timeout)
    finally:
        _stop(process)
        shutil.rmtree(root, ignore_errors=True)
