"""The storage policy: local or remote, atomic single-file writes (also under kill -9), directory commits, debris."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from prefect_gliner2.session_core import layout, storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _memory_dir() -> str:
    return f"memory://storage-test-{uuid.uuid4().hex}"


# ---- local or remote ---------------------------------------------------------------------------------------


def test_local_paths_relative_paths_and_file_urls_are_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for uri in (str(tmp_path), "runs", "./runs/key", f"file://{tmp_path}"):
        fs, path = storage.resolve(uri)
        assert storage.is_local(fs), uri
        assert os.path.isabs(path), (uri, path)
    assert storage.resolve("runs")[1] == str(tmp_path / "runs")
    assert storage.resolve(f"file://{tmp_path}/x/")[1] == str(tmp_path / "x")


def test_memory_urls_are_remote() -> None:
    fs, path = storage.resolve("memory://bucket/runs/")
    assert not storage.is_local(fs)
    assert path.endswith("bucket/runs")


# ---- single files ------------------------------------------------------------------------------------------


def test_local_atomic_write_replaces_the_file_owner_only_without_leftovers(tmp_path: Path) -> None:
    fs, target = storage.resolve(str(tmp_path / "sub" / "cursor.json"))
    storage.write_atomic(fs, target, b"old")
    storage.write_atomic(fs, target, b"new")
    assert Path(target).read_bytes() == b"new"
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path / "sub")) == ["cursor.json"]


_WRITER = """
import sys
sys.path.insert(0, {root!r})
from prefect_gliner2.session_core import storage
fs, path = storage.resolve({target!r})
contents = [bytes([65]) * 4_000_000, bytes([66]) * 3_000_000]
print("ready", flush=True)
i = 0
while True:
    storage.write_atomic(fs, path, contents[i % 2])
    i += 1
"""


def test_a_killed_local_writer_leaves_the_old_or_the_new_content(tmp_path: Path) -> None:
    """kill -9 a process that keeps replacing a file: every time, the file holds one complete version, and the
    only other thing in the directory is a temporary file that remove_debris deletes."""
    target = str(tmp_path / "cursor.json")
    versions = {b"A" * 4_000_000, b"B" * 3_000_000}
    seen = set()
    for attempt in range(6):
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER.format(root=ROOT, target=target)], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(0.15 + 0.07 * attempt)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        data = Path(target).read_bytes()
        assert data in versions, f"attempt {attempt}: {len(data)} bytes, starting {data[:1]!r}"
        seen.add(data[:1])
        fs, folder = storage.resolve(str(tmp_path))
        leftovers = storage.remove_debris(fs, folder)
        assert all(layout.is_debris(name, "cursor.json") for name in leftovers), leftovers
        assert sorted(os.listdir(tmp_path)) == ["cursor.json"]
    assert seen, "the writer never completed a write"


def test_remote_atomic_write_is_one_object_write() -> None:
    root = _memory_dir()
    fs, folder = storage.resolve(root)
    storage.write_atomic(fs, f"{folder}/run/cursor.json", b"old")
    storage.write_atomic(fs, f"{folder}/run/cursor.json", b"new")
    assert fs.cat_file(f"{folder}/run/cursor.json") == b"new"
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(f"{folder}/run", detail=False)] == ["cursor.json"]


# ---- directories committed by a marker ---------------------------------------------------------------------


def test_local_directory_commit_is_invisible_until_the_rename(tmp_path: Path) -> None:
    uri = str(tmp_path / "checkpoints" / "step-000001-batch-000001")
    seen_before_commit = []

    def before_commit() -> None:
        siblings = os.listdir(tmp_path / "checkpoints")
        seen_before_commit.append((os.path.exists(uri), siblings))

    with storage.directory_commit(uri, "index.json", what="checkpoint", before_commit=before_commit) as commit:
        commit.write("a.bin", b"a")
        (commit.local_dir() / "b.bin").write_bytes(b"b")
        commit.commit(b"{}")
    assert len(seen_before_commit) == 1
    existed, siblings = seen_before_commit[0]
    assert not existed and len(siblings) == 1 and layout.is_debris(siblings[0], "step-000001-batch-000001")
    assert sorted(os.listdir(uri)) == ["a.bin", "b.bin", "index.json"]
    assert os.stat(uri).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(uri, "a.bin")).st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path / "checkpoints") == ["step-000001-batch-000001"]
    with pytest.raises(FileExistsError, match="already exists and is not empty"):
        storage.directory_commit(uri, "index.json", what="checkpoint")


def test_a_failed_local_directory_commit_leaves_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "export")
    with pytest.raises(RuntimeError, match="boom"), storage.directory_commit(uri, "export.json", what="export") as c:
        c.write("a.bin", b"a")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_remote_directory_commit_writes_the_marker_last() -> None:
    uri = f"{_memory_dir()}/export"
    fs, path = storage.resolve(uri)
    before = []
    commit = storage.directory_commit(
        uri, "export.json", what="export", before_commit=lambda: before.append(fs.ls(path, detail=False))
    )
    with commit:
        commit.write("a.bin", b"a")
        (commit.local_dir() / "sub").mkdir()
        (commit.local_dir() / "sub" / "b.bin").write_bytes(b"b")
        commit.commit(b'{"done": true}')
        upload = commit.local_dir()
    assert not upload.exists()  # the local upload folder is removed
    names = sorted(p.rsplit("/", 1)[-1] for p in before[0])
    assert names == [layout.PENDING_FILE, "a.bin", "sub"]  # everything but the marker was in place before it
    assert fs.cat_file(f"{path}/sub/b.bin") == b"b" and fs.cat_file(f"{path}/export.json") == b'{"done": true}'
    assert not fs.exists(f"{path}/{layout.PENDING_FILE}")  # removed once the marker is written


def test_an_interrupted_remote_commit_is_replaced_anything_else_refused() -> None:
    uri = f"{_memory_dir()}/export"
    fs, path = storage.resolve(uri)
    killed = storage.directory_commit(uri, "export.json", what="export")
    killed.write("a.bin", b"half")  # ... and the process dies here: pending marker, no export.json
    assert storage.interrupted_commit(fs, path, "export.json")
    with storage.directory_commit(uri, "export.json", what="export") as again:
        again.write("a.bin", b"whole")
        again.commit(b"{}")
    assert fs.cat_file(f"{path}/a.bin") == b"whole"
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) == ["a.bin", "export.json"]
    foreign = f"{_memory_dir()}/theirs"
    fs.pipe_file(f"{storage.resolve(foreign)[1]}/model.bin", b"not ours")
    with pytest.raises(FileExistsError, match="already exists and is not empty"):
        storage.directory_commit(foreign, "export.json", what="export")


# ---- debris ------------------------------------------------------------------------------------------------


def _make(folder: Path, dirs: list[str], files: tuple[str, ...] = ()) -> None:
    for name in dirs:
        (folder / name).mkdir()
        (folder / name / "f").write_bytes(b"x")
    for name in files:
        (folder / name).write_bytes(b"x")


def test_remove_debris_takes_staging_leftovers_and_nothing_else(tmp_path: Path) -> None:
    debris = [f".step-000002-batch-000004{layout.STAGING_MARKER}123-abcd", ".cursor.json.k2j3.tmp"]
    kept = ["step-000001-batch-000002", ".damaged-step-000001-batch-000002-1700000000", ".lease", "cursor.json"]
    _make(tmp_path, [debris[0], kept[0], kept[1]], (debris[1], kept[2], kept[3]))
    fs, folder = storage.resolve(str(tmp_path))
    assert sorted(storage.remove_debris(fs, folder)) == sorted(debris)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert storage.remove_debris(fs, f"{folder}/missing") == []


def test_remove_debris_of_one_target_keeps_other_targets_staging(tmp_path: Path) -> None:
    mine, other = layout.staging_name("export"), layout.staging_name("export-2")
    _make(tmp_path, [mine, other, "export-2"])
    fs, folder = storage.resolve(str(tmp_path))
    assert storage.remove_debris(fs, folder, of="export") == [mine]
    assert sorted(os.listdir(tmp_path)) == sorted([other, "export-2"])


def test_remove_uncommitted_removes_the_directory_and_its_staging(tmp_path: Path) -> None:
    name = layout.checkpoint_name(3, 7)
    staging, other = layout.staging_name(name), layout.staging_name(layout.checkpoint_name(4, 9))
    _make(tmp_path, [name, staging, other])
    assert sorted(storage.remove_uncommitted(str(tmp_path / name))) == sorted([name, staging])
    assert os.listdir(tmp_path) == [other]


def test_remove_debris_on_remote_storage() -> None:
    fs, folder = storage.resolve(_memory_dir())
    fs.pipe_file(f"{folder}/.export{layout.STAGING_MARKER}1-ab/f", b"x")
    fs.pipe_file(f"{folder}/export/f", b"x")
    assert storage.remove_debris(fs, folder) == [f".export{layout.STAGING_MARKER}1-ab"]
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)] == ["export"]


# ---- names -------------------------------------------------------------------------------------------------


def test_checkpoint_names_sort_by_position_and_parse_back() -> None:
    assert layout.checkpoint_name(12, 47) == "step-000012-batch-000047"
    assert layout.parse_checkpoint_name("step-000012-batch-000047") == (12, 47)
    for other in ("step-12-batch-47", ".damaged-step-000012-batch-000047-1", "step-000012-batch-000047.tmp"):
        assert layout.parse_checkpoint_name(other) is None
    assert not layout.is_debris(layout.damaged_name("step-000012-batch-000047", 1700000000))


def test_a_checkpoint_is_invisible_until_its_index_commits(tmp_path: Path) -> None:
    from prefect_gliner2.session_core.checkpoint import checkpoint_exists, read_checkpoint, write_checkpoint

    uri = str(tmp_path / layout.CHECKPOINTS_DIR / layout.checkpoint_name(1, 1))
    visible_before_commit = []
    write_checkpoint(
        uri, {"a.bin": b"a"}, {"k": 1}, before_commit=lambda: visible_before_commit.append(checkpoint_exists(uri))
    )
    assert visible_before_commit == [False] and checkpoint_exists(uri)
    checkpoint = read_checkpoint(uri)
    assert checkpoint.require("a.bin") == b"a" and checkpoint.meta == {"k": 1}
    assert sorted(os.listdir(uri)) == ["a.bin", layout.CHECKPOINT_INDEX_FILE]
