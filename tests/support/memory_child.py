"""A spawned child that reports how many page faults reallocating a freed 64 MiB block costs it (glibc malloc)."""

from __future__ import annotations

import ctypes
import os
import resource
from typing import Any

BLOCK = 64 << 20


def _touch(libc: Any) -> int:
    address = libc.malloc(BLOCK)
    ctypes.memset(address, 1, BLOCK)
    return int(address)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fault_probe(conn: Any) -> None:
    """Send (page faults of a first malloc + fill of the block, of a second one after freeing it, this process's
    GLIBC_TUNABLES). The first is the baseline: with huge pages a block faults in far fewer than one per page."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = _faults()
    address = _touch(libc)
    first = _faults() - before
    libc.free(address)
    before = _faults()
    address = _touch(libc)
    second = _faults() - before
    libc.free(address)
    conn.send((first, second, os.environ.get("GLIBC_TUNABLES")))
    conn.close()
