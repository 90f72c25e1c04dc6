"""How much of a file the kernel holds in its page cache: ``mincore(2)`` over a mapping of the file, through ctypes
(Python has no binding). Mapping a file does not read it, so the check itself caches nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def cached_pages(path: Path) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages it has)."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    if not pages:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(byte & 1 for byte in vector), pages
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def read_through_cache(folder: Path) -> None:
    """Read every file in `folder` once (into the page cache)."""
    for path in sorted(folder.iterdir()):
        path.read_bytes()


def cached_files(folder: Path) -> dict[str, int]:
    """Name -> cached pages of every file in `folder` with at least one page cached."""
    counts = {path.name: cached_pages(path)[0] for path in sorted(folder.iterdir())}
    return {name: count for name, count in counts.items() if count}
