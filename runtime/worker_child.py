"""The session worker process: its entry point, the request loop, and dying with its parent.

Started by ``prefect_gliner2.runtime.worker.SessionWorker`` in a spawn-context child. It leaves the terminal's
process group (its parent handles Ctrl-C and SIGTERM, and closes it), dies with its parent (Linux
PR_SET_PDEATHSIG, plus a watchdog on ``os.getppid()`` and pipe EOF), builds its ``SessionRunner`` (which pins the
torch thread count, builds the session from the run's manifest and restores the checkpoint it is given) before
answering anything, then executes each request in order (``session_runner``) and answers with its result or the
error (after which the process exits: a worker that raised is never reused).

Importing this module is cheap (torch loads inside ``SessionRunner``), so the flow process can reference
``worker_main`` as the spawn target without importing torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from prefect_gliner2.runtime.protocol import Call, Close, Init, Reply, Status, encode_error
from prefect_gliner2.runtime.session_runner import SessionRunner, StartClock
from prefect_gliner2.runtime.worker_setup import head_start

__all__ = ["die_with_parent", "leave_process_group", "quiet_logging", "worker_main"]

PR_SET_PDEATHSIG = 1
_WATCHDOG_SECONDS = 0.5


def worker_main(conn: Any, parent_pid: int) -> None:
    """Entry point of the child process (see the module docstring)."""
    leave_process_group()
    die_with_parent(parent_pid)
    quiet_logging()
    clock = StartClock()
    # before the run arrives: a spare (runtime.spare) has it done by then; a worker spawned for its run has the run
    # by the time torch is imported, and starts reading its checkpoint before importing the rest
    init, head_started = _import_training_stack(conn, clock)
    if init is None:
        try:
            init = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        clock.mark("run")
    try:
        runner = SessionRunner(init.spec, init.restore, head_started=head_started, start=clock)
    except BaseException as exc:  # noqa: BLE001 - reported to the client, then this process exits
        _reply_error(conn, 0, exc)
        os._exit(2)
    conn.send(Reply(0, runner.status(Status())))
    _serve(conn, runner)


def _import_training_stack(conn: Any, clock: StartClock) -> tuple[Init | None, bool]:
    """Import what building a session imports (torch, transformers, gliner2 and the session engine): most of a
    worker's start, the same modules whenever the run arrives. Torch first: when the run is already here then (a
    worker spawned for it), its checkpoint's background read starts before the seconds of transformers and gliner2
    imports (``worker_setup.head_start``), and the run is returned with whether that head start ran. A failure here
    is left for ``SessionRunner`` to raise and report."""
    init: Init | None = None
    head_started = False
    try:
        import torch  # noqa: F401

        if conn.poll(0):
            try:
                init = conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            clock.mark("run")
            if init.restore:
                clock.mark("prefetch")
            head_start(init.spec, init.restore)
            head_started = True
        from gliner2 import AutoExtractor  # noqa: F401  (imports gliner2.auto and the model classes)

        import prefect_gliner2.training.managed  # noqa: F401
        import prefect_gliner2.training.session_checkpoint  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - raised again, and reported, where the run's build imports it
        pass
    clock.mark("imported")
    return init, head_started


def _serve(conn: Any, runner: SessionRunner) -> None:
    while True:
        try:
            message: Call | Close = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone
        if isinstance(message, Close):
            runner.close()
            conn.close()
            _exit_after_close()
        try:
            result = runner.execute(message.request)
        except BaseException as exc:  # noqa: BLE001 - a worker that raised is never reused
            _reply_error(conn, message.op_id, exc)
            os._exit(3)
        conn.send(Reply(message.op_id, result))


def _exit_after_close() -> NoReturn:
    """Exit at once after "close": the session is released and every write settled (``SessionRunner.close``), and
    nothing of this process is needed after it. Returning instead would end in ``sys.exit`` (multiprocessing's spawn
    entry point) and the interpreter's finalization, whose garbage collection over torch's, transformers' and
    gliner2's objects took most of the 2.18 s ``SessionWorker.close()`` waited on the ~1 s bench model (0.36 s
    with this exit; ``bench/run_end.py``). Only the standard streams and logging need flushing first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _reply_error(conn: Any, op_id: int, exc: BaseException) -> None:
    try:
        conn.send(Reply(op_id, encode_error(exc, os.getpid())))
        conn.close()
    except (OSError, ValueError):
        pass


def leave_process_group() -> None:
    """Run in a session of our own: terminal signals (Ctrl-C, SIGTERM to the group) are the parent's to handle.

    The parent spawns this process with SIGINT and SIGTERM blocked; one sent to the group before the ``setsid``
    is pending, and is discarded here (setting a signal to ignored drops it) before both are unblocked.
    """
    with contextlib.suppress(OSError):
        os.setsid()
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        signal.signal(sig, signal.SIG_IGN)
        signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def die_with_parent(parent_pid: int, *, watchdog: bool = True) -> None:
    """SIGKILL when the thread that started this process ends (Linux), exit 70 at once when `parent_pid` is not the
    parent any more, and (with `watchdog`) a thread that checks that every half second."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(70)
    if not watchdog:
        return

    def watch() -> None:
        while True:
            time.sleep(_WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(70)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def quiet_logging() -> None:
    """Quiet tokenizers and transformers, deterministic cuBLAS workspaces (kept where set), warnings to stderr."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s session-worker %(levelname)s %(message)s")
