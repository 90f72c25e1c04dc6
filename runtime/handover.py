"""A finished run's session worker handed over to the caller that asked for it, instead of closed: one more job in
a process that has imported torch, transformers and gliner2 already.

    with keep_worker(run_key):
        summary = train_flow(..., run_key=run_key)     # the run closes well: its worker is kept, not closed
        worker = take(run_key)                         # None when it was not kept (a failure, a run found complete)
        if worker is not None:
            try:
                scores = worker.call(Score(...)).scores
            finally:
                worker.close(wait=False)
    # a kept worker nobody took is closed here

The retraining flow scores its candidate this way (``Score``: the worker releases the run's session first, then
builds the scoring sessions as a fresh process would), instead of spawning one more process that spends seconds of
CPU importing the same modules. Only a run that ends well hands its worker over (``runtime.run.OpenRun.close``);
a failed run's worker is closed or kept for a retry as before. Prefect-free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prefect_gliner2.runtime.worker import SessionWorker

__all__ = ["deposit", "keep_worker", "take"]

_WANTED: dict[str, SessionWorker | None] = {}  # run keys asked for; the worker once deposited
_LOCK = threading.Lock()


@contextmanager
def keep_worker(run_key: str) -> Iterator[None]:
    """While the block runs, the run `run_key` ending well deposits its worker here for ``take``; at the block's
    end a worker nobody took is closed."""
    with _LOCK:
        _WANTED.setdefault(run_key, None)
    try:
        yield
    finally:
        with _LOCK:
            left = _WANTED.pop(run_key, None)
        if left is not None:
            left.close(wait=False)


def deposit(run_key: str, worker: SessionWorker) -> bool:
    """Keep `worker` of the run `run_key`, which ended well, when a ``keep_worker`` block asked for it (True: the
    caller must not close it)."""
    with _LOCK:
        if run_key not in _WANTED or not worker.alive:
            return False
        previous, _WANTED[run_key] = _WANTED[run_key], worker
    if previous is not None and previous is not worker:
        previous.close(wait=False)
    return True


def take(run_key: str) -> SessionWorker | None:
    """The live worker deposited for `run_key` (the caller closes it), or None (one that died meanwhile is
    closed)."""
    with _LOCK:
        worker = _WANTED.get(run_key)
        if worker is not None:
            _WANTED[run_key] = None
    if worker is not None and not worker.alive:
        worker.close(wait=False)
        return None
    return worker
