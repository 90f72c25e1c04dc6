"""Damaged restore points: quarantined and rewound to the newest intact earlier checkpoint, or refused clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory
from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import write_checkpoint
from prefect_gliner2.session_core.errors import CheckpointError


def _checkpoint(run_dir: RunDirectory, name: str, cursor: int, step: int, fingerprint: str = "fp") -> None:
    write_checkpoint(
        run_dir.checkpoint_uri(name),
        {"managed.json": b"{}"},
        {"kind": "managed", "plan_fingerprint": fingerprint, "cursor": cursor, "step": step, "finished": False},
    )


def test_a_damaged_newest_checkpoint_rewinds_to_the_previous_intact_one(tmp_path: Path) -> None:
    run_dir = RunDirectory(str(tmp_path), "r")
    run_dir.create()
    _checkpoint(run_dir, "step-000002-batch-000003", 4, 2)
    _checkpoint(run_dir, "step-000003-batch-000005", 6, 3, fingerprint="other")  # another plan: never used
    _checkpoint(run_dir, "step-000004-batch-000007", 8, 4)
    run_dir.commit_cursor(DurableCursor("step-000004-batch-000007", 8, 4, 1, False, "fp"))
    assert run_dir.recover_damaged_restore_point(lambda i: i // 4) is None  # intact: nothing to do
    (Path(run_dir.path) / "checkpoints" / "step-000004-batch-000007" / "managed.json").write_bytes(b"{!}")
    assert run_dir.recover_damaged_restore_point(lambda i: i // 4) == "step-000004-batch-000007"
    cursor = run_dir.read_cursor()
    assert (cursor.checkpoint, cursor.cursor, cursor.step, cursor.epoch) == ("step-000002-batch-000003", 4, 2, 0)
    names = sorted(p.name for p in (Path(run_dir.path) / "checkpoints").iterdir())
    assert any(n.startswith(f"{layout.DAMAGED_PREFIX}step-000004-batch-000007-") for n in names)
    assert run_dir.remove_debris() == []  # the quarantined checkpoint stays for inspection
    assert json.loads((Path(run_dir.path) / "cursor.json").read_text())["checkpoint"] == "step-000002-batch-000003"


def test_no_intact_earlier_checkpoint_is_refused_clearly(tmp_path: Path) -> None:
    run_dir = RunDirectory(str(tmp_path), "r")
    run_dir.create()
    run_dir.commit_cursor(DurableCursor("step-000001-batch-000001", 2, 1, 0, False, "fp"))  # its files are gone
    before = (Path(run_dir.path) / "cursor.json").read_bytes()
    with pytest.raises(CheckpointError, match="no intact earlier checkpoint"):
        run_dir.recover_damaged_restore_point(lambda i: 0)
    assert (Path(run_dir.path) / "cursor.json").read_bytes() == before


def test_a_half_pruned_checkpoint_before_the_cursor_is_debris_one_after_it_is_not(tmp_path: Path) -> None:
    """A run killed while pruning (index gone, files not yet) and then retried with nothing left to checkpoint
    must not keep the index-less directory forever: opening the run removes it. An index-less directory after the
    cursor is a write in flight (or its debris, which the next write of that position replaces) and stays here."""
    run_dir = RunDirectory(str(tmp_path), "r")
    run_dir.create()
    for name, cursor, step in (("step-000001-batch-000001", 2, 1), ("step-000002-batch-000003", 4, 2)):
        _checkpoint(run_dir, name, cursor, step)
    run_dir.commit_cursor(DurableCursor("step-000002-batch-000003", 4, 2, 1, False, "fp"))
    folder = Path(run_dir.path) / "checkpoints"
    (folder / "step-000001-batch-000001" / layout.CHECKPOINT_INDEX_FILE).unlink()  # the prune's first half
    (folder / "step-000003-batch-000005").mkdir()  # a later write, its index not yet written
    (folder / "step-000003-batch-000005" / "managed.json").write_bytes(b"{}")
    assert run_dir.uncommitted_checkpoints() == ["step-000001-batch-000001", "step-000003-batch-000005"]
    assert run_dir.remove_debris() == ["step-000001-batch-000001"]
    assert run_dir.uncommitted_checkpoints() == ["step-000003-batch-000005"]
    assert run_dir.committed_checkpoints() == ["step-000002-batch-000003"]
