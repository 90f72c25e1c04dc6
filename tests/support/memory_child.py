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


def fault_probe(conn: Any) -> None:
    """Send (page faults of the second malloc + fill of a block just freed, this process's GLIBC_TUNABLES)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(_touch(libc))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    address = _touch(libc)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(address)
    conn.send((faults, os.environ.get("GLIBC_TUNABLES")))
    conn.close()
