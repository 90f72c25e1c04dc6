"""Spawning worker children from one long-lived thread, so their parent-death signal means the process died.

Linux's PR_SET_PDEATHSIG fires when the *thread* that forked a child ends; starting workers from Prefect's
short-lived task-runner threads would kill them when such a thread exits, so ``start_child`` hands every start to a
single daemon thread that lives as long as the process. Children start with the terminal's signals (SIGINT,
SIGTERM) blocked (``worker_main`` leaves the process group, then unblocks them), and without re-importing the
parent's ``__main__`` (a user script). ``reap`` waits for a child to exit and kills it after a timeout.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.spawn
import queue
import signal
import threading
from typing import Any

__all__ = ["CONTEXT", "reap", "start_child"]

CONTEXT = multiprocessing.get_context("spawn")


def reap(process: Any, timeout: float) -> None:
    """Wait up to `timeout` seconds for `process` to exit, then kill it."""
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(5)


class _Spawner:
    """Starts child processes from a single daemon thread that lives as long as the process.

    PR_SET_PDEATHSIG is tied to the thread that forked the child: starting workers from Prefect's short-lived
    task-runner threads would kill them when such a thread exits. This thread only exits with the process.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Any, queue.Queue[BaseException | None]]] = queue.Queue()
        threading.Thread(target=self._serve, name="gliner2-worker-spawner", daemon=True).start()

    def start(self, process: Any) -> None:
        reply: queue.Queue[BaseException | None] = queue.Queue(maxsize=1)
        self._requests.put((process, reply))
        error = reply.get()
        if error is not None:
            raise error

    def _serve(self) -> None:
        # children start with the terminal's signals blocked; worker_main leaves the process group, then unblocks
        signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        while True:
            process, reply = self._requests.get()
            _LOCAL.skip_main = True
            try:
                process.start()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                reply.put(exc)
            else:
                reply.put(None)
            finally:
                _LOCAL.skip_main = False


_GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_LOCAL = threading.local()
_SPAWNER: _Spawner | None = None
_SPAWNER_LOCK = threading.Lock()
_ORIGINAL_PREPARATION = multiprocessing.spawn.get_preparation_data


def _preparation_data(name: str) -> dict[str, Any]:
    """Spawn preparation without re-importing the parent's ``__main__`` (a user script) in the worker."""
    data = _ORIGINAL_PREPARATION(name)
    if getattr(_LOCAL, "skip_main", False):
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
    return data


def _spawner() -> _Spawner:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            multiprocessing.spawn.get_preparation_data = _preparation_data  # type: ignore[assignment]
            _SPAWNER = _Spawner()
        return _SPAWNER


def start_child(process: Any) -> None:
    """Start `process` (from ``CONTEXT``) on the long-lived spawner thread; re-raises what its start raised."""
    _spawner().start(process)
