"""Writing large local files around the page cache (``O_DIRECT``), for files nobody reads back soon.

A buffered write copies every byte into the page cache first: the kernel must find a free page for each 4 KiB, and
the copy stays cached until memory pressure evicts it. For a run's last checkpoint and its exported model, written
once and not read again by this process, that is pure cost: on a virtual machine whose host backs each new guest
page on first use it dominated the end of a run (``bench/flow.py``'s "last batch to exit": an 816 MiB checkpoint
took 2.7 s written through the cache and fsynced, the same bytes 0.7-0.9 s with ``O_DIRECT``: scratch
timings, not a benchmark), and on any machine
it pushes the user's own cached files out. ``DirectFile`` writes through one page-aligned bounce buffer (the
alignment ``O_DIRECT`` needs for the memory, the length and the file offset), and writes the file's unaligned last
piece through the cache; the caller still fsyncs (``O_DIRECT`` does not make the file's size or metadata durable).

Where the filesystem refuses ``O_DIRECT`` (tmpfs, some network and FUSE filesystems: ``EINVAL`` at open or at the
first write) or the platform has no such flag, the same file is written through the cache instead: same bytes,
only the speed differs. Checkpoints written during a run keep the cache: a resume after a kill reads them from it.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any

__all__ = ["ALIGN", "BUFFER_BYTES", "DirectFile", "open_direct", "open_new_file"]

#: Alignment of memory, length and offset for ``O_DIRECT`` writes: a page, which covers 512-byte and 4 KiB sectors.
ALIGN = mmap.PAGESIZE
#: The bounce buffer: one reused, page-aligned block; each full buffer is one write.
BUFFER_BYTES = 8 << 20

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectFile:
    """A new file opened for writing, written through a page-aligned buffer with ``O_DIRECT`` where the filesystem
    allows it, else through the page cache (see the module docstring). A binary write-only stream: ``write``,
    ``flush`` (writes out everything given so far; later writes go through the cache), ``fileno`` and ``close``.
    `direct` says whether the bytes so far avoided the cache."""

    def __init__(self, fd: int, *, direct: bool) -> None:
        self._fd = fd
        self.direct = direct
        self._buffer = mmap.mmap(-1, BUFFER_BYTES) if direct else None
        self._view = memoryview(self._buffer) if self._buffer is not None else None
        self._fill = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._view is None:
            self._write_all(view)
            return len(view)
        done = 0
        while done < len(view):
            take = min(len(view) - done, BUFFER_BYTES - self._fill)
            self._view[self._fill : self._fill + take] = view[done : done + take]
            self._fill += take
            done += take
            if self._fill == BUFFER_BYTES:
                self._drain(BUFFER_BYTES)
        return len(view)

    def flush(self) -> None:
        """Write out everything written so far (the unaligned rest through the cache: the file stays exact)."""
        if self._view is None:
            return
        aligned = self._fill - self._fill % ALIGN
        if aligned:
            self._drain(aligned)
        rest = bytes(self._view[: self._fill])
        self._fill = 0
        self._to_cache()
        self._release()  # from here on the file goes through the cache: its offset may be unaligned
        self._write_all(memoryview(rest))

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            self._release()
            os.close(self._fd)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release(self) -> None:
        view, buffer, self._view, self._buffer = self._view, self._buffer, None, None
        if view is not None and buffer is not None:
            try:
                view.release()
                buffer.close()
            except BufferError:
                pass  # a slice of it is still referenced (e.g. by a traceback's frame): freed along with that

    def _drain(self, count: int) -> None:
        """Write the buffer's first `count` bytes (a multiple of ALIGN) and keep what follows them."""
        view = self._view
        assert view is not None
        written = 0
        while written < count:
            try:
                got = os.write(self._fd, view[written:count])
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._to_cache()  # the filesystem took the open but not the write: go through the cache
                continue
            written += got
            if got % ALIGN and written < count:
                self._to_cache()  # a short, unaligned write: the rest cannot go direct
        rest = self._fill - count
        if rest:
            view[:rest] = view[count : self._fill]
        self._fill = rest

    def _to_cache(self) -> None:
        if self.direct:
            import fcntl  # only where O_DIRECT exists (Linux): not imported on platforms without it

            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
            self.direct = False

    def _write_all(self, view: memoryview) -> None:
        while len(view):
            view = view[os.write(self._fd, view) :]


def open_direct(path: str | os.PathLike[str], mode: int = 0o600) -> DirectFile:
    """Create the new file `path` (refused if it exists) for writing with ``O_DIRECT`` where the filesystem and the
    platform allow it, else through the page cache."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if _O_DIRECT:
        try:
            return DirectFile(os.open(path, flags | _O_DIRECT, mode), direct=True)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return DirectFile(os.open(path, flags, mode), direct=False)


def open_new_file(path: str | os.PathLike[str], mode: int = 0o600) -> Any:
    """Create the new file `path` (refused if it exists) for buffered binary writing, through the page cache."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")
