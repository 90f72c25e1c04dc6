"""Session workers forked from a preloaded server process: a worker starts with torch, transformers and gliner2
already imported.

A spawned worker spends ~3.5-4 s of CPU importing torch (0.9 s), transformers and gliner2 (2.3 s) before it builds
anything; a process that starts several workers (a sweep's trials, a retrain's training and scoring, a served
deployment's runs, a test suite) pays that every time. Here one server process per flow process is started exactly as
a worker was (``spawn.start_child``: the spawn context, the long-lived spawner thread, ``worker_environment()``),
imports what ``worker_main`` imports before a run arrives, and then forks one worker per request: the fork takes
~20 ms. The same idea as multiprocessing's own "forkserver" start method, with what a session worker needs on top:

- what a spawned child would have taken from this process at its start travels with each request: the environment
  (with ``worker_environment()``), the working directory, ``sys.path``, ``sys.argv`` and the standard output and
  error (their file descriptors), so a forked worker sees what a spawned one sees now, not what the server saw when
  it started;
- variables that a library may read while it is imported (every variable but those a harness sets per run or per
  test, ``RUNTIME_ONLY``: Prefect's ``PREFECT_*``, pytest's ``PYTEST_CURRENT_TEST``), and ``sys.path``, are the
  server's identity: when they change, the next start gets a new server, and the old one exits once its last worker
  has (it forks nothing more);
- a worker's exit is observable without being its parent: the server opens a pidfd for each worker before it could
  reap it and hands it over (``sentinel``, ``is_alive``, ``kill`` through it: no pid reuse race), and reports each
  exit status; ``ForkedProcess`` is the part of ``multiprocessing.Process`` the callers use;
- dying with the flow process: the server has the worker's parent-death signal and watches its parent and its
  socket; each worker has its own on the server (``worker_main`` as before, with the server as its parent). The
  server leaves the terminal's process group as a worker does, and forks from its only Python thread (importing
  torch and gliner2 starts two native helper threads, idle in a futex wait);
- a server that cannot fork (its imports failed, CUDA initialised during them, no pidfd on this kernel) says so, and
  every start it was asked for becomes a spawned worker, which reports the import error as before.

``$PREFECT_GLINER2_WORKER_START``: ``forkserver`` (the default on Linux) or ``spawn`` (a fresh interpreter per worker,
the only mode elsewhere). The server is ~400 MB resident, most of it shared copy-on-write with each worker it forked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
import weakref
from typing import Any

from prefect_gliner2.runtime.forkserver_main import MESSAGE_BYTES, server_main, stdio_to_hand_over
from prefect_gliner2.runtime.spawn import CONTEXT, start_child, worker_environment

__all__ = [
    "ENV_WORKER_START",
    "ForkedProcess",
    "forked_workers",
    "server_pids",
    "start_mode",
    "start_worker_process",
]

logger = logging.getLogger(__name__)

ENV_WORKER_START = "PREFECT_GLINER2_WORKER_START"
_MODES = ("forkserver", "spawn")
SERVER_NAME = "gliner2-worker-forkserver"
_STARTED_TIMEOUT = 600.0  # a pid is waited for this long (the server's imports come first)


def start_mode() -> str:
    """``$PREFECT_GLINER2_WORKER_START`` (``forkserver`` by default where Linux pidfds exist, else ``spawn``);
    ConfigError for an unknown value."""
    raw = os.environ.get(ENV_WORKER_START, "").strip().lower()
    if raw and raw not in _MODES:
        from prefect_gliner2.session_core.errors import ConfigError

        raise ConfigError(
            f"${ENV_WORKER_START}={os.environ[ENV_WORKER_START]!r} is not one of {', '.join(_MODES)}: 'forkserver' "
            "(the default on Linux) forks each session worker from a process that has imported torch and gliner2, "
            "'spawn' starts a fresh interpreter per worker"
        )
    if not (sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")):
        return "spawn"
    return raw or "forkserver"


def start_worker_process(name: str) -> tuple[Any, Any]:
    """Start a session worker process (``worker_main``) named `name`; returns (process, connection): a
    ``multiprocessing.Process`` or a ``ForkedProcess``, and this end of its pipe. ConfigError for a bad
    ``$PREFECT_GLINER2_WORKER_START`` or ``$PREFECT_GLINER2_WORKER_MEMORY``."""
    mode = start_mode()
    environment = worker_environment()
    parent_conn, child_conn = CONTEXT.Pipe(duplex=True)
    if mode == "spawn":
        process = _spawned(name, child_conn)
    else:
        process = ForkedProcess(name, child_conn)
        _server_for(environment).fork(process, {**os.environ, **environment})
    return process, parent_conn


def forked_workers() -> list[tuple[str, int | None]]:
    """(name, pid) of every forked worker of this process that has not exited (pid None: not forked yet)."""
    with _LOCK:
        servers = [s for s in _SERVERS if s.pid_owner == os.getpid()]
    return [(p.name, p.pid_if_known) for server in servers for p in server.live()]


def server_pids() -> list[int]:
    """The process ids of this process's servers that have not exited (the current one last)."""
    with _LOCK:
        servers = [s for s in _SERVERS if s.pid_owner == os.getpid() and not s.dead]
    return [s.process.pid for s in servers if s.process.pid is not None]


def _spawned(name: str, child_conn: Any) -> Any:
    from prefect_gliner2.runtime.worker_child import worker_main

    process = CONTEXT.Process(target=worker_main, args=(child_conn, os.getpid()), name=name, daemon=True)
    try:
        start_child(process)
    finally:
        child_conn.close()
    return process


class ForkedProcess:
    """A session worker forked by the server: the part of ``multiprocessing.Process``'s interface the callers use
    (``pid``, ``sentinel``, ``is_alive``, ``join``, ``exitcode``, ``kill``). Its start is asynchronous: ``pid`` and
    ``sentinel`` wait for the fork (the server's own imports come first). When the server cannot fork, the handle
    spawns the worker instead and answers for that process."""

    def __init__(self, name: str, child_conn: Any) -> None:
        self.name = name
        self._child_conn: Any = child_conn  # until forked (then closed here) or handed to a spawned process
        self._started = threading.Event()
        self._exited = threading.Event()
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._code: int | None = None
        self._spawned: Any = None
        self._kill_asked = False
        self._lock = threading.Lock()

    # ---- resolved by the server's reader thread ----

    def _forked(self, pid: int, pidfd: int) -> None:
        with self._lock:
            self._pid, self._pidfd = pid, pidfd
            weakref.finalize(self, os.close, pidfd)
            conn, self._child_conn = self._child_conn, None
            self._started.set()
            kill = self._kill_asked
        conn.close()
        if kill:
            self.kill()

    def _ended(self, code: int) -> None:
        self._code = code
        self._exited.set()

    def _spawn_instead(self) -> None:
        with self._lock:
            conn, self._child_conn = self._child_conn, None
        if conn is None:
            return
        try:
            self._spawned = _spawned(self.name, conn)
        except BaseException:  # noqa: BLE001 - no process: it reads as exited with 255
            self._ended(255)
        finally:
            self._started.set()
        if self._kill_asked and self._spawned is not None:
            self._spawned.kill()

    # ---- the multiprocessing.Process part ----

    @property
    def pid(self) -> int | None:
        self._wait_started()
        return self._spawned.pid if self._spawned is not None else self._pid

    @property
    def pid_if_known(self) -> int | None:
        return self._spawned.pid if self._spawned is not None else self._pid

    @property
    def sentinel(self) -> int:
        self._wait_started()
        if self._spawned is not None:
            return int(self._spawned.sentinel)
        if self._pidfd is None:  # never started: a descriptor that is always ready
            read, write = os.pipe()
            os.close(write)
            weakref.finalize(self, os.close, read)
            self._pidfd = read
        return self._pidfd

    @property
    def exitcode(self) -> int | None:
        if self._spawned is not None:
            return int(self._spawned.exitcode) if self._spawned.exitcode is not None else None
        return self._code if self._exited.is_set() else None

    def is_alive(self) -> bool:
        if not self._started.is_set():
            return not self._exited.is_set()
        if self._spawned is not None:
            return bool(self._spawned.is_alive())
        return not self._exited.is_set() and not _ready(self._pidfd, 0)

    def join(self, timeout: float | None = None) -> None:
        if not self._started.wait(timeout):
            return
        if self._spawned is not None:
            self._spawned.join(timeout)
            return
        self._exited.wait(timeout)

    def kill(self) -> None:
        with self._lock:
            self._kill_asked = True
            pidfd, spawned = self._pidfd, self._spawned
        if spawned is not None:
            spawned.kill()
        elif pidfd is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def _wait_started(self) -> None:
        if not self._started.wait(_STARTED_TIMEOUT):
            raise TimeoutError(f"the session worker forkserver did not fork {self.name} within {_STARTED_TIMEOUT} s")


def _ready(fd: int | None, timeout: float) -> bool:
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


# ---- the flow side of a server ------------------------------------------------------------------------------


#: Variables that change from run to run or test to test of one process and that no library reads while importing:
#: a change of these does not start a new server (a forked worker still gets their values of the moment).
RUNTIME_ONLY = ("PREFECT_", "PYTEST_CURRENT_TEST")


def _identity(environment: dict[str, str]) -> tuple[Any, ...]:
    """What a server is started with that a library may read while it is imported (see the module docstring)."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith(RUNTIME_ONLY)}
    variables.update(environment)
    return tuple(sorted(variables.items())), tuple(sys.path)


class _Server:
    def __init__(self, identity: tuple[Any, ...]) -> None:
        self.identity = identity
        self.pid_owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = CONTEXT.Process(target=server_main, args=(theirs, os.getpid()), name=SERVER_NAME, daemon=True)
        try:
            start_child(self.process)
        finally:
            theirs.close()
        self.sock = ours
        self.retired = False
        self.dead = False
        self.broken: str | None = None
        self._next = 1
        self._waiting: dict[int, ForkedProcess] = {}
        self._running: dict[int, ForkedProcess] = {}
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        threading.Thread(target=self._read, name=f"{SERVER_NAME}-reader", daemon=True).start()

    def usable(self) -> bool:
        return not (self.dead or self.retired or self.broken) and self.pid_owner == os.getpid()

    def live(self) -> list[ForkedProcess]:
        with self._state_lock:
            return [*self._waiting.values(), *self._running.values()]

    def fork(self, process: ForkedProcess, environ: dict[str, str]) -> None:
        request: dict[str, Any] = {
            "op": "fork",
            "name": process.name,
            "environ": environ,
            "cwd": os.getcwd(),
            "sys_path": list(sys.path),
            "sys_argv": list(sys.argv),
        }
        with self._state_lock:
            if self.dead or self.broken:
                spawn = True
            else:
                spawn = False
                ident = self._next
                self._next += 1
                self._waiting[ident] = process
        if spawn:
            process._spawn_instead()
            return
        request["id"] = ident
        conn = process._child_conn
        assert conn is not None
        with stdio_to_hand_over() as (out, err):
            try:
                with self._send_lock:
                    socket.send_fds(self.sock, [pickle.dumps(request)], [conn.fileno(), out, err])
            except OSError:
                with self._state_lock:
                    self._waiting.pop(ident, None)
                process._spawn_instead()

    def retire(self) -> None:
        self.retired = True
        with contextlib.suppress(OSError), self._send_lock:
            self.sock.send(pickle.dumps({"op": "retire"}))

    def _read(self) -> None:
        while True:
            try:
                data, fds, _flags, _address = socket.recv_fds(self.sock, MESSAGE_BYTES, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            message = pickle.loads(data)
            op = message["op"]
            if op == "started":
                with self._state_lock:
                    process = self._waiting.pop(message["id"], None)
                    if process is not None:
                        self._running[message["pid"]] = process
                if process is None:
                    os.close(fds[0])
                else:
                    process._forked(message["pid"], fds[0])
            elif op == "exited":
                with self._state_lock:
                    process = self._running.pop(message["pid"], None)
                if process is not None:
                    process._ended(message["code"])
            elif op in ("failed", "broken"):
                self.broken = self.broken or message["why"]
                with self._state_lock:
                    if op == "failed":
                        failed = [p for p in [self._waiting.pop(message["id"], None)] if p is not None]
                    else:
                        failed = list(self._waiting.values())
                        self._waiting.clear()
                for process in failed:
                    process._spawn_instead()
        self._lost()

    def _lost(self) -> None:
        """The server exited: forks it was asked for become spawned workers; a worker it had forked was killed with
        it (its parent-death signal) unless it had exited already, and its status is unknown (255)."""
        with self._state_lock:
            self.dead = True
            waiting, running = list(self._waiting.values()), list(self._running.values())
            self._waiting.clear()
            self._running.clear()
        for process in waiting:
            process._spawn_instead()
        for process in running:
            process._ended(255)
        if running:
            logger.warning(
                "the session worker forkserver (pid %s) exited (%s); the workers it had forked died with it: %s",
                self.process.pid,
                "retired" if self.retired else "killed or crashed",
                ", ".join(f"{p.name} pid {p.pid_if_known}" for p in running),
            )
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.pid_owner == os.getpid():
            self.process.join(5)
        with _LOCK:
            if self in _SERVERS:
                _SERVERS.remove(self)


_SERVERS: list[_Server] = []
_LOCK = threading.Lock()


def _server_for(environment: dict[str, str]) -> _Server:
    identity = _identity(environment)
    with _LOCK:
        current = next((s for s in _SERVERS if s.identity == identity and s.usable()), None)
        if current is None:
            for stale in [s for s in _SERVERS if s.pid_owner == os.getpid() and not s.retired]:
                stale.retire()
            _SERVERS[:] = [s for s in _SERVERS if s.pid_owner == os.getpid()]
            current = _Server(identity)
            _SERVERS.append(current)
        return current
