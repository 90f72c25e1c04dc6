"""The process-pinned session worker, seen from the flow process: a torch-free client over a Pipe.

One ``SessionWorker`` owns one spawned child process (``prefect_gliner2.runtime.worker_child``) that holds the model,
optimizer and RNGs and executes operations strictly in the order they were sent. The client never imports torch.

    worker = SessionWorker(WorkerSpec(model="tiny:span", manifest_uri=".../manifest.json", cpu_threads=1),
                           restore_locator=run_dir.newest_checkpoint_uri)
    worker.start()                                   # spawns; the child restores the newest committed checkpoint
    worker.call(Advance(first=0, through=5))         # wait for its AdvanceResult (re-raises remote errors)
    ticket = worker.submit(Advance(first=6, through=6))     # pipelined: send now ...
    worker.call(Advance(first=6, through=6))         # ... and join it later (same result, sent once)
    worker.close()

Requests and results are the frozen dataclasses of ``prefect_gliner2.runtime.protocol``.

Operations are idempotent positions ("advance the session through batch i"), so replaying, re-sending or
skipping one never changes what the session computes. If the child dies, every outstanding call raises
``WorkerDied``; the next ``submit`` starts a fresh child from ``restore_locator()`` (a new *incarnation*). A
remote ``SessionCoreError`` is re-raised as the same class with the same fields and the remote traceback attached
(deterministic); any other remote exception becomes ``WorkerError`` naming its type (transient). A child that
raised is never reused: it exits after reporting, and the calls still outstanding on it (sent ahead) raise that
same error, not ``WorkerDied``: the cause decides whether a retry can help (a full disk never is retried).

The child is spawned from one long-lived thread of this process, so Linux's parent-death signal (which fires when
the spawning *thread* ends) fires only when the process dies; the child also watches its parent and the pipe. The
child runs in its own session: a Ctrl-C or a SIGTERM to the terminal's process group reaches only this process,
which records the run as interrupted and closes the worker (it is spawned with both signals blocked, so none reaches
it before it has left the group). The spawning itself is ``prefect_gliner2.runtime.spawn``; a start adopts the
process ``prefect_gliner2.runtime.spare.prestart_worker()`` started ahead, when one waits.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import secrets
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from prefect_gliner2.runtime.errors import WorkerDied
from prefect_gliner2.runtime.forkserver import start_worker_process
from prefect_gliner2.runtime.protocol import (
    Call,
    Close,
    CommitCheckpoint,
    Init,
    RemoteError,
    Reply,
    Request,
    Status,
    StatusResult,
    WorkerSpec,
    decode_error,
)
from prefect_gliner2.runtime.spare import take_spare
from prefect_gliner2.runtime.spawn import reap
from prefect_gliner2.session_core import layout

R = TypeVar("R")

__all__ = ["SessionWorker", "Ticket", "WorkerSpec"]

logger = logging.getLogger(__name__)


class Ticket:
    """One operation sent to one worker incarnation; ``result()`` waits for it."""

    __slots__ = ("op_id", "request", "incarnation", "_event", "_ok", "_value")

    def __init__(self, op_id: int, request: Request[Any] | None, incarnation: str) -> None:
        self.op_id, self.request, self.incarnation = op_id, request, incarnation
        self._event = threading.Event()
        self._ok = False
        self._value: Any = None

    def resolve(self, ok: bool, value: Any) -> None:
        if not self._event.is_set():
            self._ok, self._value = ok, value
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"session worker operation {self.op} did not finish within {timeout} s")
        if not self._ok:
            raise self._value
        return self._value

    @property
    def op(self) -> str:
        return self.request.op if self.request is not None else "init"


class _Link:
    """One child process (one incarnation) and the calls outstanding on it."""

    def __init__(self, process: Any, conn: Any, incarnation: str, restored_from: str | None) -> None:
        self.process, self.conn = process, conn
        self.incarnation, self.restored_from = incarnation, restored_from
        self.calls: dict[int, Ticket] = {}
        self.by_request: dict[Request[Any], Ticket] = {}
        self.dead = False
        self.error: RemoteError | None = None  # the error this child answered with, after which it exits
        self.init: Ticket = Ticket(0, None, incarnation)


class SessionWorker:
    """Client of one session worker process (see the module docstring)."""

    def __init__(
        self,
        spec: WorkerSpec,
        restore_locator: Callable[[], str | None] | None = None,
        *,
        name: str = "gliner2-session-worker",
    ) -> None:
        self.spec = spec
        self.name = name
        self._locator = restore_locator or (lambda: None)
        self._lock = threading.RLock()
        self._link: _Link | None = None
        self._next_id = 1
        self._closed = False
        self.starts = 0

    # ---- introspection -------------------------------------------------------------------------------------

    @property
    def incarnation(self) -> str | None:
        """Identifies the live child: the checkpoint it restored from (or 'fresh') plus a per-start nonce."""
        link = self._link
        return link.incarnation if link is not None and not link.dead else None

    @property
    def restored_from(self) -> str | None:
        return self._link.restored_from if self._link is not None else None

    @property
    def pid(self) -> int | None:
        return self._link.process.pid if self._link is not None else None

    @property
    def alive(self) -> bool:
        link = self._link
        return link is not None and not link.dead and link.process.is_alive()

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Make sure a child is running; returns True when this call started one."""
        with self._lock:
            if self._closed:
                raise WorkerDied(f"session worker {self.name} was closed; create a new SessionWorker")
            if self.alive:
                return False
            self._spawn()
            return True

    def _spawn(self) -> None:
        restore = self._locator()
        label = restore.rstrip("/").rsplit("/", 1)[-1] if restore else "fresh"
        incarnation = f"{label}@{secrets.token_hex(6)}"
        spare = take_spare()  # a process prestart_worker() started (and that has been importing torch since)
        process, parent_conn = spare if spare is not None else start_worker_process(self.name)
        link = _Link(process, parent_conn, incarnation, restore)
        link.calls[0] = link.init
        parent_conn.send(Init(self.spec, restore))
        self._link = link
        self.starts += 1
        threading.Thread(target=self._read, args=(link,), name=f"{self.name}-reader", daemon=True).start()
        how = "adopted the spare process" if spare is not None else "started"
        # a forked worker's pid comes after the server's imports: not waited for here
        pid = process.pid_if_known if hasattr(process, "pid_if_known") else process.pid
        where = f"pid {pid}" if pid is not None else "forked when the worker forkserver is ready"
        logger.info("session worker %s %s (%s, incarnation %s)", self.name, how, where, incarnation)

    def close(self, timeout: float = 30.0, *, wait: bool = True) -> None:
        """Ask the child to release its session and exit; kill it if it has not within `timeout`.

        With ``wait=False`` this returns at once and a daemon thread does the waiting (the child writes nothing
        after "close", so nobody needs to wait for it).
        """
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is None:
            return
        if not link.dead:
            try:
                link.conn.send(Close())
            except (OSError, ValueError):
                pass
        if wait:
            reap(link.process, timeout)
        else:
            threading.Thread(target=reap, args=(link.process, timeout), name=f"{self.name}-reaper", daemon=True).start()

    def kill(self) -> None:
        """SIGKILL the child (tests and emergencies); outstanding calls raise WorkerDied."""
        link = self._link
        if link is not None and link.process.is_alive():
            link.process.kill()

    # ---- operations ----------------------------------------------------------------------------------------

    def answered(self, request: Request[Any]) -> bool:
        """True when `request` was sent ahead and its answer (result or error) is waiting to be consumed, also from
        a child that has exited since (e.g. after raising on a later operation): `submit` then returns that
        answer instead of starting a fresh child."""
        link = self._link
        ticket = link.by_request.get(request) if link is not None else None
        return ticket is not None and ticket.done()

    def submit(self, request: Request[Any]) -> Ticket:
        """Send `request` now, or return the identical request sent earlier on this incarnation and not consumed
        yet (pipelining: a task joins the operation sent ahead for it; its answer is kept when the child exits
        afterwards, so an error it raised is not lost to a restart). Starts a fresh child if needed."""
        with self._lock:
            if self.answered(request):
                assert self._link is not None
                return self._link.by_request[request]
            self.start()
            link = self._link
            assert link is not None
            existing = link.by_request.get(request)
            if existing is not None:
                return existing
            ticket = Ticket(self._next_id, request, link.incarnation)
            self._next_id += 1
            link.calls[ticket.op_id] = ticket
            link.by_request[request] = ticket
            try:
                link.conn.send(Call(ticket.op_id, request))
            except (OSError, ValueError):
                pass  # the reader notices the death and fails the ticket
            return ticket

    def call(self, request: Request[R], timeout: float | None = None) -> R:
        """Submit `request` (or join the same request sent earlier and not consumed yet) and wait for its result
        (the protocol's result dataclass for that request)."""
        ticket = self.submit(request)
        link = self._link
        try:
            result: R = ticket.result(timeout)
            return result
        except WorkerDied:
            if link is not None and link.init.done() and not link.init._ok:
                raise link.init._value from None  # the child could not even start: that error is the cause
            raise
        finally:
            if ticket.done():
                self._forget(ticket)

    def settle(self) -> None:
        """Wait until the live child has no background checkpoint write in flight (nothing to do without a live
        child). A flow retry that reuses this worker calls it before cleaning debris: the staging files of a
        write in flight are not debris. A failed write is logged here; that child has exited and the next
        operation starts a fresh one from the durable cursor."""
        if not self.alive:
            return
        try:
            pending = self.call(Status()).pending_checkpoint
            position = layout.parse_checkpoint_name(pending.rstrip("/").rsplit("/", 1)[-1]) if pending else None
            if pending and position is not None:
                self.call(CommitCheckpoint(index=position[1], uri=pending))
        except Exception as exc:  # noqa: BLE001 - the next operation restarts the worker; the cursor never moved
            logger.warning("the background checkpoint write of session worker %s failed: %s", self.name, exc)

    def release(self, request: Request[Any]) -> None:
        """Drop the record of a request sent ahead that nobody will consume (e.g. its task was a cache hit)."""
        link = self._link
        if link is not None:
            with self._lock:
                link.by_request.pop(request, None)

    def _forget(self, ticket: Ticket) -> None:
        with self._lock:
            link = self._link
            if link is not None and ticket.request is not None and link.by_request.get(ticket.request) is ticket:
                del link.by_request[ticket.request]

    # ---- reader --------------------------------------------------------------------------------------------

    def _read(self, link: _Link) -> None:
        while True:
            ready = multiprocessing.connection.wait([link.conn, link.process.sentinel])
            if link.conn not in ready:
                break
            try:
                reply: Reply = link.conn.recv()
            except (EOFError, OSError):
                break
            error = reply.result if isinstance(reply.result, RemoteError) else None
            with self._lock:
                if error is not None:
                    link.dead = True  # a worker that raised exits; nothing more may be sent to it
                    link.error = link.error or error
                ticket = link.calls.pop(reply.op_id, None)  # stays in by_request until a caller consumes it
            if ticket is not None:
                if error is not None:
                    ticket.resolve(False, decode_error(error, link.process.pid))
                else:
                    ticket.resolve(True, reply.result)
            if reply.op_id == 0 and isinstance(reply.result, StatusResult) and reply.result.start:
                logger.info(
                    "session worker %s ready (pid %s); its start, seconds after its entry point: %s",
                    self.name,
                    link.process.pid,
                    reply.result.start_text(),
                )
        link.process.join(10)
        self._bury(link)

    def _bury(self, link: _Link) -> None:
        with self._lock:
            link.dead = True
            calls = list(link.calls.values())
            link.calls.clear()
            # answers already received stay until consumed (a pre-sent operation's result, or the error that
            # ended this child); the unanswered ones fail below with WorkerDied
            link.by_request = {r: t for r, t in link.by_request.items() if t.done()}
        code = link.process.exitcode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        origin = f"checkpoint {link.restored_from}" if link.restored_from else "the start of the plan"
        for ticket in calls:
            if link.error is not None:  # it exited because an earlier operation raised: that error is the cause
                ticket.resolve(False, decode_error(link.error, link.process.pid))
                continue
            ticket.resolve(
                False,
                WorkerDied(
                    f"session worker pid {link.process.pid} ({link.incarnation}) died ({how}) before finishing "
                    f"{ticket.op}; a retry starts a fresh worker from the newest committed checkpoint "
                    f"(this one had started from {origin})"
                ),
            )
        try:
            link.conn.close()
        except OSError:
            pass
