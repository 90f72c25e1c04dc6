"""Spawning worker children from one long-lived thread, so their parent-death signal means the process died.

Linux's PR_SET_PDEATHSIG fires when the *thread* that forked a child ends; starting workers from Prefect's
short-lived task-runner threads would kill them when such a thread exits, so ``start_child`` hands every start to a
single daemon thread that lives as long as the process. Children start with the terminal's signals (SIGINT,
SIGTERM) blocked (``worker_main`` leaves the process group, then unblocks them), and without re-importing the
parent's ``__main__`` (a user script). ``reap`` waits for a child to exit and kills it after a timeout.

Children keep the memory they free (``worker_environment``): a training step allocates and frees the same large
tensors every time (activations, gradients, the embedding's dense gradient), and glibc's default returns blocks of
128 KiB and more to the kernel on free, so every step faults all of them in again, page by page (measured at the
gliner2-base shape on 2 cores: ~480,000 page faults per update, 20-35% of its CPU time in the kernel). With glibc's
``mmap_threshold`` and ``trim_threshold`` raised, freed blocks are reused: no faults after the first steps, the same
bits (allocation addresses never change what torch computes: its CPU tensors are 64-byte aligned either way), and a
resident set that stays at the run's peak instead of shrinking between steps.
``$PREFECT_GLINER2_WORKER_MEMORY=release`` keeps glibc's defaults; thresholds the user already set in
``$GLIBC_TUNABLES`` are kept as given.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.spawn
import os
import queue
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["CONTEXT", "ENV_WORKER_MEMORY", "RETAIN_TUNABLES", "reap", "start_child", "worker_environment"]

CONTEXT = multiprocessing.get_context("spawn")
ENV_WORKER_MEMORY = "PREFECT_GLINER2_WORKER_MEMORY"
#: glibc malloc settings of a worker that keeps what it frees: blocks below 4 GiB come from the heap (not one
#: mapping each) and the heap is not trimmed below 64 GiB of free space.
RETAIN_TUNABLES = {"glibc.malloc.mmap_threshold": str(4 << 30), "glibc.malloc.trim_threshold": str(64 << 30)}
_MEMORY_MODES = ("retain", "release")


def worker_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a worker child starts with on top of this process's (`environ`, default ``os.environ``):
    ``GLIBC_TUNABLES`` with ``RETAIN_TUNABLES`` added to what is there, unless
    ``$PREFECT_GLINER2_WORKER_MEMORY`` is ``release``. ConfigError for another value."""
    environ = os.environ if environ is None else environ
    mode = environ.get(ENV_WORKER_MEMORY, "").strip() or "retain"
    if mode not in _MEMORY_MODES:
        from prefect_gliner2.session_core.errors import ConfigError

        raise ConfigError(
            f"${ENV_WORKER_MEMORY}={environ[ENV_WORKER_MEMORY]!r} is not one of {', '.join(_MEMORY_MODES)}: "
            "'retain' (the default) lets the worker reuse the memory it frees, 'release' keeps glibc's defaults"
        )
    if mode == "release":
        return {}
    given = [part for part in environ.get("GLIBC_TUNABLES", "").split(":") if part]
    names = {part.split("=", 1)[0] for part in given}
    added = [f"{name}={value}" for name, value in RETAIN_TUNABLES.items() if name not in names]
    return {"GLIBC_TUNABLES": ":".join(given + added)}


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """`extra` in this process's environment while a child is started (a spawned child inherits it), then the
    previous values back."""
    previous = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
        self._requests: queue.Queue[tuple[Any, Mapping[str, str], queue.Queue[BaseException | None]]] = queue.Queue()
        threading.Thread(target=self._serve, name="gliner2-worker-spawner", daemon=True).start()

    def start(self, process: Any, environment: Mapping[str, str]) -> None:
        reply: queue.Queue[BaseException | None] = queue.Queue(maxsize=1)
        self._requests.put((process, environment, reply))
        error = reply.get()
        if error is not None:
            raise error

    def _serve(self) -> None:
        # children start with the terminal's signals blocked; worker_main leaves the process group, then unblocks
        signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        while True:
            process, environment, reply = self._requests.get()
            _LOCAL.skip_main = True
            try:
                with _environment(environment):
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
    """Start `process` (from ``CONTEXT``) on the long-lived spawner thread, with ``worker_environment()``;
    re-raises what its start raised (ConfigError for a bad ``$PREFECT_GLINER2_WORKER_MEMORY``)."""
    _spawner().start(process, worker_environment())
