"""The worker forkserver's own process: import what a session worker imports, then fork one worker per request.

Started by ``prefect_gliner2.runtime.forkserver`` (its module docstring says why and what a forked worker takes from
the flow process); requests and answers are pickled messages on a SOCK_SEQPACKET socket pair, descriptors passed
with them (SCM_RIGHTS):

- from the flow process: ``fork`` (the worker's name, environment, working directory, ``sys.path``, ``sys.argv``;
  its pipe end, standard output and error) and ``retire`` (fork nothing more, exit after the last worker);
- to it: ``ready`` or ``broken`` (why this process must not fork) once imported, ``started`` (the pid, with a pidfd
  opened before this process could reap the worker), ``failed`` (a fork request refused: spawn instead) and
  ``exited`` (the worker's exit status, as ``multiprocessing`` reports it: -N for signal N).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["MESSAGE_BYTES", "SERVER_COMM", "WORKER_COMM", "server_main", "stdio_to_hand_over"]

MESSAGE_BYTES = 1 << 20
#: The names ``ps`` and ``top`` show (Linux ``/proc/PID/comm``, 15 characters at most): the command line of both is
#: multiprocessing's spawn entry point, the server's, which a forked worker keeps.
SERVER_COMM = "gliner2-forksrv"
WORKER_COMM = "gliner2-worker"


def server_main(sock: socket.socket, parent_pid: int) -> None:
    """Entry point of the server process (see the module docstring)."""
    from prefect_gliner2.runtime import worker_child

    worker_child.leave_process_group()
    _name_process(SERVER_COMM)
    worker_child.die_with_parent(parent_pid, watchdog=False)
    worker_child.quiet_logging()
    why = _preload()
    _send(sock, {"op": "broken", "why": why} if why else {"op": "ready"})
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid
    retiring = False
    while not (retiring and not children):
        events = selector.select(0.5)
        if os.getppid() != parent_pid:
            os._exit(0)  # the flow process is gone; the workers' parent-death signal follows this exit
        for key, _mask in events:
            if key.fileobj is not sock:
                pid = children.pop(int(key.fd))
                selector.unregister(key.fd)
                _pid, status = os.waitpid(pid, 0)
                os.close(int(key.fd))
                _send(sock, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            try:
                data, fds, _flags, _address = socket.recv_fds(sock, MESSAGE_BYTES, 3)
            except OSError:
                os._exit(0)
            if not data:
                os._exit(0)  # the flow process closed its end
            request = pickle.loads(data)
            if request["op"] == "retire":
                retiring = True
            elif why:
                _closing(fds)
                _send(sock, {"op": "failed", "id": request["id"], "why": why})
            else:
                _fork(request, fds, sock, selector, children)
    os._exit(0)


def _preload() -> str | None:
    """Import what a worker imports before its run; None, or why this process must not fork workers."""
    try:
        import torch
        from gliner2 import AutoExtractor  # noqa: F401

        import prefect_gliner2.runtime.session_runner  # noqa: F401
        import prefect_gliner2.training.managed  # noqa: F401
        import prefect_gliner2.training.session_checkpoint  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a spawned worker raises it again, and reports it
        return f"its imports failed ({type(exc).__name__}: {exc})"
    if torch.cuda.is_initialized():
        return "CUDA was initialised while importing (a forked child could not use it)"
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads after importing (forking needs one)"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        return f"this kernel has no pidfd ({exc})"
    return None


def _fork(
    request: dict[str, Any], fds: list[int], sock: socket.socket, selector: Any, children: dict[int, int]
) -> None:
    server_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        _closing(fds)
        _send(sock, {"op": "failed", "id": request["id"], "why": f"fork failed ({exc})"})
        return
    if pid == 0:
        _become_worker(request, fds, server_pid, [sock.fileno(), *children], selector)
    _closing(fds)
    pidfd = os.pidfd_open(pid)  # before this process can reap it: the descriptor names this very process
    children[pidfd] = pid
    selector.register(pidfd, selectors.EVENT_READ)
    socket.send_fds(sock, [pickle.dumps({"op": "started", "id": request["id"], "pid": pid})], [pidfd])


def _become_worker(
    request: dict[str, Any], fds: list[int], server_pid: int, inherited: list[int], selector: Any
) -> None:
    """In the forked child: take what a spawned child would have taken from the flow process, then run the worker;
    never returns."""
    code = 1
    try:
        import multiprocessing
        import multiprocessing.connection

        from prefect_gliner2.runtime.worker_child import worker_main

        selector.close()
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn_fd, out, err = fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (out, err):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        sys.path[:] = request["sys_path"]
        sys.argv[:] = request["sys_argv"]
        os.environ.clear()
        os.environ.update(request["environ"])
        multiprocessing.current_process().name = request["name"]
        _name_process(WORKER_COMM)
        worker_main(multiprocessing.connection.Connection(conn_fd), server_pid)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the worker's standard error, as a spawned worker would
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.send(pickle.dumps(message))


def _closing(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def stdio_to_hand_over() -> Iterator[tuple[int, int]]:
    """(In the flow process) its standard output and error as descriptors to hand to a worker (/dev/null for a
    closed one)."""
    opened: list[int] = []
    fds = []
    for fd in (1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_WRONLY))
            opened.append(fds[-1])
    try:
        yield fds[0], fds[1]
    finally:
        for fd in opened:
            os.close(fd)


def _name_process(name: str) -> None:
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as handle:
        handle.write(name)
