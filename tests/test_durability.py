"""Local directory commits make everything durable before the rename: every file (streamed or written by a library
into local_dir) and every directory fsynced, the fsyncs in flight together, failures raised, no handle leaked."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from prefect_gliner2.session_core import durability, storage


class FsyncSpy:
    """Records which paths were fsynced (by any thread) and what had been fsynced when a rename happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: str | None = None) -> None:
        self.synced: list[str] = []
        self.at_rename: list[tuple[str, set[str]]] = []
        self.threads: set[int] = set()
        self._lock = threading.Lock()
        self._fail = fail
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            with self._lock:
                self.threads.add(threading.get_ident())
            if self._fail is not None and path.endswith(self._fail):
                raise OSError(errno.EIO, "injected fsync failure", path)
            real_fsync(fd)
            with self._lock:
                self.synced.append(path)

        def rename(source: str, target: str) -> None:
            with self._lock:
                self.at_rename.append((str(source), set(self.synced)))
            real_rename(source, target)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_every_file_and_directory_is_durable_before_the_rename(tmp_path: Path, monkeypatch) -> None:
    spy = FsyncSpy(monkeypatch)
    target = tmp_path / "out" / "ckpt"
    with storage.directory_commit(str(target), "index.json", what="test") as commit:
        for i in range(6):
            with commit.open(f"f{i}.bin") as handle:
                handle.write(bytes([i]) * 1000)
        staging = commit.local_dir()
        (staging / "adapter").mkdir()
        (staging / "adapter" / "lib.bin").write_bytes(b"written by a library")  # e.g. save_pretrained
        (staging / "config.json").write_bytes(b"{}")
        commit.commit(b'{"done": true}')
    (source, synced_then), *_ = spy.at_rename
    staged = [source, *(str(p).replace(str(target), source) for p in target.rglob("*"))]
    assert sorted(staged) == sorted(set(synced_then) & set(staged))  # all of it, before the rename
    assert len(staged) == 11  # 6 streamed + 2 library files + the marker, the subdirectory, the staging itself
    assert spy.synced[-1] == str(target.parent)  # the rename itself made durable last
    assert len(spy.threads) > 1  # handed to the fsync threads, not one after another in the caller
    assert (target / "f3.bin").read_bytes() == bytes([3]) * 1000
    assert (target / "adapter" / "lib.bin").read_bytes() == b"written by a library"


@pytest.mark.parametrize("failing", ["f2.bin", "lib.bin", "index.json"])
def test_a_failed_fsync_fails_the_commit_and_leaves_nothing(tmp_path: Path, monkeypatch, failing: str) -> None:
    FsyncSpy(monkeypatch, fail=failing)
    target = tmp_path / "ckpt"
    before = _open_fds()
    with pytest.raises(OSError, match="injected fsync failure"):
        with storage.directory_commit(str(target), "index.json", what="test") as commit:
            for i in range(4):
                with commit.open(f"f{i}.bin") as handle:
                    handle.write(b"x" * 100)
            (commit.local_dir() / "lib.bin").write_bytes(b"y")
            commit.commit(b"{}")
    assert not target.exists()
    assert os.listdir(tmp_path) == []  # the staging directory is gone too
    assert _open_fds() == before  # every handle was closed, also those whose fsync failed or was still pending


def test_sync_batch_waits_for_everything_and_raises_the_first_failure(tmp_path: Path, monkeypatch) -> None:
    FsyncSpy(monkeypatch, fail="bad")
    batch = durability.SyncBatch()
    for name in ("a", "bad", "b"):
        (tmp_path / name).write_bytes(b"z")
        batch.add_path(tmp_path / name)
    batch.add_dir(tmp_path)
    with pytest.raises(OSError, match="injected"):
        batch.wait()
    batch.wait()  # nothing left: a second wait returns at once
