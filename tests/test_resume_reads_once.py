"""Resume reads each checkpoint once: the flow process opens only checkpoint indexes (the worker's verified restore is
the only payload read), and damage found by that restore still falls back to the previous intact checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.session_core import layout

from support.config import training_config
from support.flow import assert_same_export, make_space, run_flow

pytestmark = pytest.mark.usefixtures("prefect_server")

_OPENED: list[str] = []
_WATCHING = threading.Event()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHING.is_set() and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while _WATCHING is set


@contextmanager
def opened_files() -> Iterator[list[str]]:
    """Every file this process opens meanwhile (any thread; the worker is another process and not seen)."""
    _OPENED.clear()
    _WATCHING.set()
    try:
        yield _OPENED
    finally:
        _WATCHING.clear()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run trained to the end with every checkpoint kept: the reference the resumed runs must equal bit for bit."""
    space = make_space(tmp_path_factory.mktemp("reads-once"))
    storage = space["root"] / "runs"
    base = dict(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        storage=str(storage),
        checkpointing={"checkpoint_every": 2, "keep_checkpoints": None},
    )
    summary = run_flow(**base, run_key="reference")
    return {"base": base, "storage": storage, "export": summary["export"]}


def _staged(finished: dict[str, Any], key: str, checkpoint: str) -> Path:
    """A copy of the finished run as a kill right after `checkpoint` committed would have left it."""
    source, target = finished["storage"] / "reference", finished["storage"] / key
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("export", ".lease"))
    meta = json.loads((target / "checkpoints" / checkpoint / "checkpoint.json").read_text())["meta"]
    cursor = json.loads((target / "cursor.json").read_text())
    cursor.update(checkpoint=checkpoint, cursor=meta["cursor"], step=meta["step"], finished=False)
    cursor.update(epoch=meta.get("epoch", 0), export=None, summary=None)
    (target / "cursor.json").write_text(json.dumps(cursor, sort_keys=True, indent=1))
    at = layout.parse_checkpoint_name(checkpoint)
    for name in os.listdir(target / "checkpoints"):  # the checkpoints after it never happened
        position = layout.parse_checkpoint_name(name)
        if position is not None and at is not None and position > at:
            shutil.rmtree(target / "checkpoints" / name)
    return target


def _checkpoint_files_opened(opened: list[str], run: Path) -> list[str]:
    folder = str(run / layout.CHECKPOINTS_DIR) + "/"
    return sorted({path for path in opened if path.startswith(folder)})


def test_resume_opens_only_checkpoint_indexes_in_the_flow_process(finished: dict[str, Any]) -> None:
    run = _staged(finished, "intact", "step-000003-batch-000005")
    with opened_files() as opened:
        summary = run_flow(**finished["base"], run_key="intact")
    assert summary["resumed_from_batch"] == 6 and summary["worker_starts"] == 1
    assert_same_export(summary["export"], finished["export"])
    seen = _checkpoint_files_opened(opened, run)
    assert str(run / "checkpoints" / "step-000003-batch-000005" / layout.CHECKPOINT_INDEX_FILE) in seen
    payloads = [p for p in seen if not p.endswith("/" + layout.CHECKPOINT_INDEX_FILE)]
    assert payloads == [], f"the flow process read checkpoint payloads: {payloads}"


def test_a_flipped_weight_byte_is_found_by_the_worker_and_the_run_continues_exactly(finished: dict[str, Any]) -> None:
    run = _staged(finished, "flipped", "step-000004-batch-000007")
    weights = run / "checkpoints" / "step-000004-batch-000007" / layout.WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # a payload byte: sizes and the index still agree, only the hash differs
    weights.write_bytes(bytes(data))
    with opened_files() as opened:
        summary = run_flow(**finished["base"], run_key="flipped")
    assert summary["resumed_from_batch"] == 6  # from the previous intact checkpoint, step-000003-batch-000005
    assert_same_export(summary["export"], finished["export"])
    quarantined = [n for n in os.listdir(run / "checkpoints") if n.startswith(layout.DAMAGED_PREFIX)]
    assert len(quarantined) == 1 and quarantined[0].startswith(f"{layout.DAMAGED_PREFIX}step-000004-batch-000007-")
    payloads = [p for p in _checkpoint_files_opened(opened, run) if not p.endswith("/" + layout.CHECKPOINT_INDEX_FILE)]
    assert payloads == [], f"the flow process read checkpoint payloads: {payloads}"
