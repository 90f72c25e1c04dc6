"""The automatic task grain (the default): units grow from one batch as the worker times them, and a run killed and
resumed with it trains exactly what an uninterrupted run trains."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows import driver
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.schedule import Unit

from support.config import training_config
from support.flow import (
    assert_same_export,
    flow_child,
    make_inputs,
    reference_export,
    run_flow,
    tiny_model_dir,
    wait_for_marker,
)
from support.processes import kill9


def test_a_run_killed_and_resumed_with_the_automatic_grain_equals_an_uninterrupted_run(
    prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 48 records, batch 2, accumulation 2, 2 epochs: 48 batches; checkpoints every 4 updates (8 batches) and at
    # the epoch ends; the defaults: batches_per_task "auto", pipeline_depth "auto"
    inputs = make_inputs(tmp_path / "data", n_train=48)
    model = tiny_model_dir(tmp_path, "span")
    params: dict[str, Any] = dict(
        model=model,
        train_data=inputs["train"],
        valid_data=inputs["valid"],
        config=training_config(),
        run_key="auto-grain",
        storage=str(tmp_path / "runs"),
        checkpointing={"checkpoint_every": 4},
    )
    markers = tmp_path / "markers"
    markers.mkdir()
    crashed = flow_child(params, FaultPlan((Fault.pause("batch", 37, 120),), markers=str(markers)), prefect_server)
    try:
        wait_for_marker(markers, "batch-37", crashed, timeout=240)  # past the checkpoint after batch 31
        _wait_for_cursor(tmp_path / "runs" / "auto-grain", 32, timeout=60)  # the flow commits it as results arrive
    finally:
        output = kill9(crashed)  # the flow process; its worker dies with it
    assert "Traceback" not in output, output[-3000:]

    units: list[Unit] = []
    original = driver.run_unit
    monkeypatch.setattr(driver, "run_unit", lambda key, unit, **kw: units.append(unit) or original(key, unit, **kw))
    summary = run_flow(**params)
    assert summary["resumed_from_batch"] == 32 and summary["worker_starts"] == 1
    advances = [u for u in units if u.kind == "advance"]
    assert advances[0].first == 32 and advances[-1].through == 47
    assert [u.through - u.first + 1 for u in advances[:3]] == [1, 1, 1]  # three sent ahead before any was timed
    assert max(u.through - u.first + 1 for u in advances) >= 4  # then grown (x4 per timed unit, to the boundaries)
    reference = reference_export(model, inputs, training_config(), tmp_path / "direct")
    assert_same_export(summary["export"], reference)


def test_the_automatic_checkpoint_cadence_skips_the_100_update_points_of_a_fast_run_and_changes_no_bit(
    prefect_server: str, tmp_path: Path
) -> None:
    """Default checkpointing ("auto") on 240 updates of a few tens of ms: the points at steps 100 and 200 come
    seconds after the start, not the 30 s apart the cadence asks, so only the epoch end checkpoints; the export is
    the uninterrupted direct run's, bit for bit."""
    from prefect_gliner2.runtime.rundir import RunDirectory

    inputs = make_inputs(tmp_path / "data", n_train=240)
    model = tiny_model_dir(tmp_path, "span")
    config = training_config(batch_size=1, gradient_accumulation_steps=1, num_epochs=1, eval_strategy="no")
    storage = str(tmp_path / "runs")
    summary = run_flow(
        model=model,
        train_data=inputs["train"],
        valid_data=inputs["valid"],
        config=config,
        run_key="auto-cadence",
        storage=storage,
        checkpointing={"keep_checkpoints": None},
    )
    assert summary["total_steps"] == 240
    assert RunDirectory(storage, "auto-cadence").committed_checkpoints() == ["step-000240-batch-000239"]
    assert_same_export(summary["export"], reference_export(model, inputs, config, tmp_path / "direct"))


def _wait_for_cursor(run_dir: Path, at: int, timeout: float) -> None:
    """Until cursor.json names the checkpoint that continues at batch `at` (the worker, paused further on, wrote it
    already; the flow process commits the cursor when the checkpoint task's result reaches it, later on a busy
    machine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cursor = json.loads((run_dir / "cursor.json").read_text())["cursor"]
        except (OSError, ValueError, KeyError):
            cursor = None
        if cursor == at:
            return
        assert time.monotonic() < deadline, f"the cursor stayed at {cursor}, not {at}"
        time.sleep(0.2)
