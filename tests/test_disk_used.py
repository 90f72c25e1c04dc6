"""A run's reported disk use counts what is stored: a file linked under two names (a finished run's export sharing
its last checkpoint's weights) once, on local storage; object storage is summed as listed."""

from __future__ import annotations

import os
from pathlib import Path

from prefect_gliner2.runtime.resources import disk_used
from prefect_gliner2.runtime.rundir import RunDirectory


def test_a_linked_file_counts_once(tmp_path: Path) -> None:
    run_dir = RunDirectory(str(tmp_path), "run")
    checkpoint = Path(run_dir.path) / "checkpoints" / "step-000001-batch-000000"
    checkpoint.mkdir(parents=True)
    (checkpoint / "weights.safetensors").write_bytes(b"w" * 1000)
    (checkpoint / "optimizer.safetensors").write_bytes(b"o" * 300)
    export = Path(run_dir.path) / "export"
    export.mkdir()
    os.link(checkpoint / "weights.safetensors", export / "model.safetensors")
    (export / "config.json").write_bytes(b"{}")
    used = disk_used(run_dir)
    assert used["disk_bytes"] == 1000 + 300 + 2
    assert used["checkpoint_bytes"] == 1000 + 300
    (export / "model.safetensors").unlink()
    (export / "model.safetensors").write_bytes(b"w" * 1000)  # a copy is stored twice
    assert disk_used(run_dir)["disk_bytes"] == 2000 + 300 + 2


def test_object_storage_is_summed_as_listed() -> None:
    import fsspec

    run_dir = RunDirectory("memory://disk-used-test", "run")
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{run_dir.path}/checkpoints/step-000001-batch-000000/weights.safetensors", b"w" * 1000)
    fs.pipe(f"{run_dir.path}/export/model.safetensors", b"w" * 1000)
    try:
        used = disk_used(run_dir)
        assert (used["disk_bytes"], used["checkpoint_bytes"], used["checkpoints_kept"]) == (2000, 1000, 0)
    finally:
        fs.rm("/disk-used-test", recursive=True)
