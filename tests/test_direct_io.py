"""`session_core.direct_io`: files written around the page cache are byte-exact, whatever the piece sizes, and fall
back to the cache (same bytes) where the filesystem refuses O_DIRECT."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from prefect_gliner2.session_core import direct_io
from prefect_gliner2.session_core.direct_io import ALIGN, BUFFER_BYTES, open_direct


def _direct_allowed(folder: Path) -> bool:
    """Whether this filesystem takes an O_DIRECT open and an aligned O_DIRECT write (probed independently)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    import mmap

    probe = folder / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        block = mmap.mmap(-1, ALIGN)
        os.write(fd, block)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def _write_in_pieces(path: Path, data: bytes, seed: int) -> bool:
    rng = random.Random(seed)
    with open_direct(path) as handle:
        direct = handle.direct
        at = 0
        while at < len(data):
            size = rng.choice([1, 7, ALIGN - 1, ALIGN, 3 * ALIGN + 5, BUFFER_BYTES - 1, BUFFER_BYTES + 11])
            handle.write(memoryview(data)[at : at + size])
            at += size
        os.fsync(handle.fileno())
    return direct


@pytest.mark.parametrize(
    "size", [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BUFFER_BYTES, BUFFER_BYTES + ALIGN + 7, 2 * BUFFER_BYTES + 12345]
)
def test_bytes_are_exact_for_any_size_and_piece_sizes(tmp_path: Path, size: int) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "file.bin"
    direct = _write_in_pieces(path, data, seed=size)
    assert path.read_bytes() == data
    assert direct == _direct_allowed(tmp_path)  # direct wherever this filesystem takes it; the cache otherwise
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_writes_after_flush_go_through_the_cache_and_stay_exact(tmp_path: Path) -> None:
    first, second = os.urandom(ALIGN * 3 + 17), os.urandom(BUFFER_BYTES + 3)
    path = tmp_path / "file.bin"
    with open_direct(path) as handle:
        handle.write(first)
        handle.flush()
        assert not handle.direct
        handle.write(second)
    assert path.read_bytes() == first + second


def test_an_existing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file.bin"
    path.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        open_direct(path)
    assert path.read_bytes() == b"keep"


def test_refused_at_open_falls_back_to_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_direct(path: object, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(direct_io.os, "open", no_direct)
    data = os.urandom(BUFFER_BYTES + 999)
    path = tmp_path / "file.bin"
    assert not _write_in_pieces(path, data, seed=1)
    assert path.read_bytes() == data


def test_refused_at_the_first_write_falls_back_without_losing_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if _direct_allowed(tmp_path) else 0)
    real_write = os.write
    refused: list[int] = []

    def refuse_once(fd: int, data: object) -> int:
        if not refused:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")  # what a filesystem says that took the open only
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(direct_io.os, "write", refuse_once)
    data = os.urandom(2 * BUFFER_BYTES + 77)
    path = tmp_path / "file.bin"
    with direct_io.DirectFile(os.open(path, flags, 0o600), direct=True) as handle:
        handle.write(data)
        assert not handle.direct
    assert refused and path.read_bytes() == data


def test_other_write_errors_are_raised_and_the_descriptor_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "write", full)
    handle = open_direct(tmp_path / "file.bin")
    with pytest.raises(OSError) as raised:
        handle.write(os.urandom(BUFFER_BYTES))
    assert raised.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as again:
        handle.close()  # the rest cannot be written either: raised again, the descriptor released all the same
    assert again.value.errno == errno.ENOSPC and handle.closed
