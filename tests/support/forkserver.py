"""Fresh processes without their imports: a server process imports torch, transformers, gliner2 and the training
package once, then forks one child per request that runs a support module as ``python -m support.<module>`` would.

A child is a new process that has built nothing: the server never builds a model or a session, never starts a
thread and never runs a torch operation, so a forked child holds exactly what a fresh interpreter holds once it has
imported those modules (the state a spare session worker is in when its run arrives), and its exit ends everything it
built. What it saves is the ~5 s of CPU each fresh interpreter spends importing torch, transformers and gliner2.

    python -m support.forkserver            # with tests/ on PYTHONPATH; requests on stdin, one JSON line each

Request: ``{"module": "session_child", "argv": ["<json>"]}``; the server answers ``{"pid": <child pid>}`` at once,
then ``{"returncode": n, "stdout": "...", "stderr": "..."}`` when the child has exited (killed by signal s:
returncode -s, as subprocess reports it). End of input ends the server. The client is ``ForkServer`` below.
"""

from __future__ import annotations

import json
import os
import queue
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

__all__ = ["ForkServer", "PRELOADED"]

PRELOADED = (
    "torch",
    "safetensors.torch",
    "gliner2",
    "prefect_gliner2.training",
    "prefect_gliner2.training.managed",
    "prefect_gliner2.training.session_checkpoint",
)


def _child(module: str, argv: list[str], out: str, err: str) -> None:
    """In the forked child: stdout and stderr to the given files, run the module as __main__, exit with its status."""
    code = 0
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
    try:
        sys.argv = [module, *argv]
        runpy.run_module(f"support.{module}", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would report it
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _serve() -> None:
    for name in PRELOADED:
        __import__(name)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    assert threads == 1, f"the fork server runs {threads} threads: a forked child would lack them"
    requests, replies = sys.stdin, sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=replies, flush=True)
    for line in requests:
        request = json.loads(line)
        with tempfile.TemporaryDirectory(prefix="forkserver-") as scratch:
            out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
            pid = os.fork()
            if pid == 0:
                _child(request["module"], request["argv"], out, err)
            print(json.dumps({"pid": pid}), file=replies, flush=True)
            _, status = os.waitpid(pid, 0)
            returncode = os.waitstatus_to_exitcode(status)
            reply = {"returncode": returncode, "stdout": Path(out).read_text(), "stderr": Path(err).read_text()}
        print(json.dumps(reply), file=replies, flush=True)


class ForkServer:
    """The client: starts ``python -m support.forkserver`` with `env`; ``run`` runs one module in a forked child."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.env = dict(env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "support.forkserver"],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, name="forkserver-replies", daemon=True).start()
        self._read(timeout=300)  # {"ready": pid}: the imports are done

    def run(self, module: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``support.<module>`` with `argv` in a forked child; the child is killed after `timeout` seconds
        (subprocess.TimeoutExpired)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"module": module, "argv": argv}) + "\n")
        self.process.stdin.flush()
        pid = self._read(timeout=60)["pid"]
        try:
            reply = self._read(timeout=timeout)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._read(timeout=60)
            raise subprocess.TimeoutExpired([module, *argv], timeout) from None
        return subprocess.CompletedProcess([module, *argv], reply["returncode"], reply["stdout"], reply["stderr"])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put("")  # end of output: the server exited

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the fork server did not answer within {timeout} s") from None
        if not line:
            self._lines.put("")
            raise RuntimeError(f"the fork server exited ({self.process.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of pytest ends the server by closing its input
    _serve()
