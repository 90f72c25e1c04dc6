"""Hashing checkpoint files while they are written or read: chunked sha256 pieces hashed in helper threads.

A file's digest (see ``format``) is computed in the same pass as its write or read: each completed piece of
``chunk_bytes`` goes to a shared thread pool (hashlib releases the GIL), so hashing overlaps the I/O and several
pieces hash at once; a plain sha256 (format-2 entries) is updated in order by one thread. Buffers are bounded.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from collections.abc import Callable
from typing import Any

from prefect_gliner2.session_core.checkpoint.format import chunked_header
from prefect_gliner2.session_core.errors import CheckpointError

__all__ = ["CHUNK_BYTES", "HASH_CHUNK_BYTES", "HASH_THREADS", "HashStream", "set_hash_threads"]

#: Bytes per read or write call and per piece handed to the hash (bounded buffers, hashing overlapped with I/O).
CHUNK_BYTES = 8 << 20
#: Piece size of the chunked sha256 written into new indexes (each entry records its own; readers use that one).
HASH_CHUNK_BYTES = 8 << 20
#: Threads hashing pieces in parallel (at most this many times two, plus two, pieces wait to be hashed): the CPUs
#: this process may use, at most 8; a session worker sets it to its slot's ``cpu_threads`` (``set_hash_threads``).
HASH_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The shared hashing pool with `threads` threads (1: in submission order, for plain sha256 streams)."""
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
    """The hash of a byte stream fed in order, computed in helper threads while the caller does the I/O.

    `chunk_bytes` None: the plain sha256 (format-2 entries), updated in order by one thread. Otherwise the chunked
    sha256 (see the module docstring): each completed piece is hashed by the next free thread. Buffers given to
    `add` are hashed later: they must stay unchanged until `hexdigest` returns. At most ``2 * HASH_THREADS + 2``
    hash jobs are pending; `add` waits for the oldest beyond that (bounded memory when buffers are temporary)."""

    def __init__(self, chunk_bytes: int | None) -> None:
        self._chunk = chunk_bytes
        self._plain = hashlib.sha256() if chunk_bytes is None else None
        self._pieces: list[memoryview] = []
        self._filled = 0
        self.size = 0
        self._jobs: list[concurrent.futures.Future[Any]] = []
        self._settled = 0

    def add(self, view: memoryview) -> None:
        self.size += len(view)
        if self._plain is not None:
            self._submit(_pool(1), self._plain.update, view)
            return
        assert self._chunk is not None
        while len(view):
            take = min(len(view), self._chunk - self._filled)
            self._pieces.append(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self._chunk:
                self._seal()

    def hexdigest(self) -> str:
        if self._plain is not None:
            for job in self._jobs[self._settled :]:
                job.result()
            return self._plain.hexdigest()
        if self._pieces:
            self._seal()
        digests = b"".join(job.result() for job in self._jobs)
        return hashlib.sha256(chunked_header(self._chunk or 0, self.size) + digests).hexdigest()

    def _seal(self) -> None:
        pieces, self._pieces, self._filled = self._pieces, [], 0
        self._submit(_pool(HASH_THREADS), _pieces_digest, pieces)

    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, job: Callable[[Any], Any], arg: Any) -> None:
        self._jobs.append(pool.submit(job, arg))
        while len(self._jobs) - self._settled > 2 * HASH_THREADS + 2:
            self._jobs[self._settled].result()
            self._settled += 1
