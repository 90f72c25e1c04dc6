"""Hashing checkpoint files while they are written or read, in helper threads that overlap the I/O.

A file's digest (see ``format``) is computed in the same pass as its write or read. BLAKE3 (format 4): one hasher
per file, itself multithreaded (``blake3(max_threads=HASH_THREADS)``), fed in order by one helper thread, so that
hashing piece k overlaps the I/O of piece k+1; small pieces with nothing pending are hashed at once in the calling
thread (no hand-off latency for the many small files of a checkpoint). Chunked sha256 (format 3): each completed
piece of ``chunk_bytes`` goes to a shared pool and several pieces hash at once. Plain sha256 (format 2): updated in
order by one helper thread. hashlib and blake3 release the GIL while hashing. Buffers are bounded.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from collections.abc import Callable
from typing import Any

import blake3

from prefect_gliner2.session_core.checkpoint.format import DigestScheme, chunked_header
from prefect_gliner2.session_core.errors import CheckpointError

__all__ = ["CHUNK_BYTES", "HASH_THREADS", "INLINE_BELOW", "MULTITHREAD_FROM", "HashStream", "set_hash_threads"]

#: Bytes per read or write call and per piece handed to the hash (bounded buffers, hashing overlapped with I/O).
CHUNK_BYTES = 8 << 20
#: Pieces shorter than this are hashed in the calling thread when no earlier piece is still being hashed.
INLINE_BELOW = 1 << 20
#: Files known to be shorter than this are hashed by one BLAKE3 thread (its threads cost microseconds per call).
MULTITHREAD_FROM = 4 << 20
#: Threads hashing one stream (BLAKE3's own threads, or chunked-sha256 pieces in parallel; at most this many times
#: two, plus two, pieces wait to be hashed): the CPUs this process may use, at most 8; a session worker sets it to
#: its slot's ``cpu_threads`` (``set_hash_threads``).
HASH_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The shared hashing pool with `threads` threads (1: in submission order, for the ordered streams)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="checkpoint-hash")
            _pools[threads] = pool
        return pool


def _forget_pools() -> None:
    global _pools_lock
    _pools.clear()  # a forked child has none of the parent's threads, and maybe a lock one of them held
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def set_hash_threads(threads: int) -> None:
    """Hash with at most `threads` threads in this process (capped at 8), e.g. a worker slot's CPU share, so
    checkpoint hashing never uses more CPUs than the training it belongs to."""
    global HASH_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CheckpointError(f"hash threads must be a positive int, got {threads!r}")
    HASH_THREADS = min(8, threads)


def _pieces_digest(pieces: list[memoryview]) -> bytes:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.digest()


class HashStream:
    """The digest (`scheme`, see ``format``) of a byte stream fed in order, computed in helper threads while the
    caller does the I/O.

    Buffers given to `add` may be hashed later: they must stay unchanged until `hexdigest` returns. At most
    ``2 * HASH_THREADS + 2`` hash jobs are pending; `add` waits for the oldest beyond that (bounded memory when
    buffers are temporary). `size_hint`: the stream's length when known; BLAKE3 uses one thread below
    ``MULTITHREAD_FROM``."""

    def __init__(self, scheme: DigestScheme, size_hint: int | None = None) -> None:
        self._scheme = scheme
        self._ordered: Any = None
        if scheme.key == "blake3":
            small = size_hint is not None and size_hint < MULTITHREAD_FROM
            self._ordered = blake3.blake3(max_threads=1 if small else HASH_THREADS)
        elif scheme.key == "sha256":
            self._ordered = hashlib.sha256()
        self._pieces: list[memoryview] = []
        self._filled = 0
        self.size = 0
        self._jobs: list[concurrent.futures.Future[Any]] = []
        self._settled = 0

    def add(self, view: memoryview) -> None:
        self.size += len(view)
        if self._ordered is not None:
            if len(view) < INLINE_BELOW and self._idle():
                self._ordered.update(view)
            else:
                self._submit(_pool(1), self._ordered.update, view)
            return
        chunk = self._scheme.chunk_bytes
        assert chunk is not None
        while len(view):
            take = min(len(view), chunk - self._filled)
            self._pieces.append(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == chunk:
                self._seal()

    def hexdigest(self) -> str:
        if self._ordered is not None:
            for job in self._jobs[self._settled :]:
                job.result()
            return str(self._ordered.hexdigest())
        if self._pieces:
            self._seal()
        digests = b"".join(job.result() for job in self._jobs)
        header = chunked_header(self._scheme.chunk_bytes or 0, self.size)
        return hashlib.sha256(header + digests).hexdigest()

    def _idle(self) -> bool:
        """No submitted piece is still being hashed (so that one hashed here keeps the order)."""
        return not self._jobs or self._jobs[-1].done()

    def _seal(self) -> None:
        pieces, self._pieces, self._filled = self._pieces, [], 0
        self._submit(_pool(HASH_THREADS), _pieces_digest, pieces)

    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, job: Callable[[Any], Any], arg: Any) -> None:
        self._jobs.append(pool.submit(job, arg))
        while len(self._jobs) - self._settled > 2 * HASH_THREADS + 2:
            self._jobs[self._settled].result()
            self._settled += 1
