"""A spare session worker: a worker process started before its run is known, adopted by the next worker start.

A worker spends most of its start importing torch, transformers and gliner2 (seconds of CPU, before it builds
anything); it does that before it waits for its run (``worker_main``). The flow process meanwhile has its own start
to do: ``prefect-gliner2 train`` starts a local Prefect server, and every flow run is created through the API, takes
the run key's lease and records the manifest before ``open_run`` starts the worker. ``prestart_worker()`` starts a
worker process at once, with nothing to run yet, so that the two overlap; the next ``SessionWorker`` to start in
this process adopts it (``take_spare``) and sends it its run exactly as it would a process it had just spawned.
Nothing differs in what the worker computes: the same entry point, the same environment (``worker_environment``),
the same imports before the run arrives.

``$PREFECT_GLINER2_SPARE_WORKER=off`` starts none (then a worker is spawned when its run opens, as without this
module); ``on`` is the default.

A spare nobody adopts is killed by ``discard_spare()`` (it has done nothing but import), which the callers run when
their run ends: the CLI command, and ``train_flow`` for the spare it started. One spare at most per process; a spare
whose environment no longer matches what a worker would get now (``$PREFECT_GLINER2_WORKER_MEMORY`` or
``$GLIBC_TUNABLES`` changed), or that died, is discarded instead of adopted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.runtime.forkserver import start_worker_process
from prefect_gliner2.runtime.spawn import reap, worker_environment

__all__ = [
    "ENV_SPARE_WORKER",
    "discard_spare",
    "prestart_worker",
    "spare_enabled",
    "spare_pid",
    "spare_worker",
    "take_spare",
]

SPARE_NAME = "gliner2-session-worker-spare"
ENV_SPARE_WORKER = "PREFECT_GLINER2_SPARE_WORKER"
_SPARE_MODES = ("on", "off")


@dataclass
class _Spare:
    process: Any
    conn: Any
    environment: dict[str, str]
    parent_pid: int


_SPARE: _Spare | None = None
_LOCK = threading.Lock()


def prestart_worker() -> bool:
    """Start a spare worker process now unless one is waiting (see the module docstring); returns True when this
    call started one. ConfigError for a bad ``$PREFECT_GLINER2_WORKER_MEMORY`` (as a worker start would raise)."""
    global _SPARE
    if not spare_enabled():
        return False
    with _LOCK:
        if _SPARE is not None and _usable(_SPARE):
            return False
        stale, _SPARE = _SPARE, None
        environment = worker_environment()
        process, parent_conn = start_worker_process(SPARE_NAME)
        _SPARE = _Spare(process, parent_conn, environment, os.getpid())
    if stale is not None:
        _kill(stale)
    return True


def spare_enabled() -> bool:
    """Whether ``prestart_worker`` starts spares: ``$PREFECT_GLINER2_SPARE_WORKER`` ``on`` (default) or ``off``;
    ConfigError for another value."""
    mode = os.environ.get(ENV_SPARE_WORKER, "").strip().lower() or "on"
    if mode not in _SPARE_MODES:
        from prefect_gliner2.session_core.errors import ConfigError

        raise ConfigError(
            f"${ENV_SPARE_WORKER}={os.environ[ENV_SPARE_WORKER]!r} is not one of {', '.join(_SPARE_MODES)}: 'on' (the "
            "default) starts the worker process while the run is prepared, 'off' starts it when the run opens"
        )
    return mode == "on"


@contextmanager
def spare_worker() -> Iterator[None]:
    """A spare started for the block (unless one is waiting already) and discarded at its end if nobody adopted it."""
    prestart_worker()
    try:
        yield
    finally:
        discard_spare()


def take_spare() -> tuple[Any, Any] | None:
    """The waiting spare's (process, connection) for a worker start to adopt, or None (then the caller spawns)."""
    global _SPARE
    with _LOCK:
        spare, _SPARE = _SPARE, None
    if spare is None:
        return None
    if not _usable(spare):
        _kill(spare)
        return None
    return spare.process, spare.conn


def spare_pid() -> int | None:
    """The process id of the spare waiting to be adopted, None when none is."""
    with _LOCK:
        return _SPARE.process.pid if _SPARE is not None else None


def discard_spare() -> None:
    """Kill the waiting spare, if any: it has only imported, so nothing is lost."""
    global _SPARE
    with _LOCK:
        spare, _SPARE = _SPARE, None
    if spare is not None:
        _kill(spare)


def _usable(spare: _Spare) -> bool:
    return spare.parent_pid == os.getpid() and spare.process.is_alive() and spare.environment == worker_environment()


def _kill(spare: _Spare) -> None:
    try:
        spare.conn.close()
    except OSError:
        pass
    if spare.parent_pid != os.getpid():
        return  # a forked copy of this module's state: the process is not this process's child
    if spare.process.is_alive():
        spare.process.kill()
    threading.Thread(target=reap, args=(spare.process, 5.0), name="gliner2-spare-reaper", daemon=True).start()
