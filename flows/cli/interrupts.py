"""Ctrl-C and SIGTERM in the console script: the command stops, its run is recorded as crashed, and it says how to
resume.

``handling_signals()`` turns the first SIGINT into ``KeyboardInterrupt`` and the first SIGTERM into ``Terminated``
(while a flow runs, Prefect's engine has its own SIGTERM handler raising ``TerminationSignal``: it records the flow
run as crashed, as it does for a ``KeyboardInterrupt``); later ones are ignored so that clean-up (closing the
worker, stopping the local server) is not cut short. ``exit_status(exc)`` maps those exceptions to the shell's
128 + signal number (130, 143), ``None`` for anything else; the console script then ends with ``exit_now``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

from prefect_gliner2.flows.prefect_compat import signal_status
from prefect_gliner2.runtime.errors import exception_chain

__all__ = ["RESUME_HINT", "Terminated", "exit_now", "exit_status", "handling_signals", "report_interrupt"]

RESUME_HINT = "interrupted; run the same command again to resume from the last checkpoint"


class Terminated(BaseException):
    """SIGTERM arrived outside a flow run (a flow run's engine raises Prefect's ``TerminationSignal``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signal = signum


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises in the main thread; the ones after are ignored."""
    fired = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_status(exc: BaseException) -> int | None:
    """128 + the signal number for an interrupt (KeyboardInterrupt: SIGINT; ``Terminated`` or Prefect's
    ``TerminationSignal``: its signal), also when `exc` was raised while handling one (its cause/context chain),
    ``None`` for any other exception."""
    for linked in exception_chain(exc):
        status = _signal_status(linked)
        if status is not None:
            return status
    return None


def _signal_status(exc: BaseException) -> int | None:
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    if isinstance(exc, Terminated):
        return 128 + exc.signal
    return signal_status(exc)  # Prefect's TerminationSignal (prefect_compat, rule 5)


def report_interrupt() -> None:
    print(RESUME_HINT, file=sys.stderr, flush=True)


def exit_now(status: int) -> NoReturn:
    """End the process at once after an interrupt was handled (the console script only).

    By then the run is recorded as crashed and a local server stopped; here the Prefect logs and events still
    queued are sent and the live session workers are asked to close (one still busy in a batch dies with this
    process: its parent-death signal). The interpreter's own teardown is skipped: with torch and gliner2 loaded
    (the demo scores in this process) it takes 5-7 s on a busy machine.
    """
    if "prefect" in sys.modules:
        from prefect_gliner2.flows.prefect_compat import drain_queued

        drain_queued()
    if "prefect_gliner2.runtime.live_runs" in sys.modules:
        from prefect_gliner2.runtime import live_runs

        live_runs.close_all()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
