"""The training flow in this process: exact equality with a direct run, retries, caching, refusals, UI reports."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.runtime import spare
from prefect_gliner2.runtime import worker as worker_module
from prefect_gliner2.runtime.errors import RunConflictError, RunKeyError, RunLockedError
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.lease import RunLease
from prefect_gliner2.runtime.protocol import AdvanceResult
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.runtime.worker import SessionWorker
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, layout
from prefect_gliner2.session_core.scoring import Counts, DatasetSchema, score_records
from prefect_gliner2.tasks import checkpoints as checkpoint_tasks
from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES, tiny_records

from support.config import training_config
from support.flow import assert_same_export, installed_faults, make_space, reference_export, run_flow
from support.processes import assert_no_spare_left

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("flow"))


def _task_runs(flow_run_id: str, timeout: float = 30.0) -> list[Any]:
    """The flow run's task runs once the server has recorded them all in a final state (it does so from events,
    asynchronously: poll until every state is final and the set stops growing)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    query = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    deadline, previous = time.monotonic() + timeout, -1
    with get_client(sync_client=True) as client:
        while True:
            runs = list(client.read_task_runs(flow_run_filter=query))
            settled = all(r.state is not None and r.state.is_final() for r in runs)
            if (settled and len(runs) == previous) or time.monotonic() > deadline:
                return runs
            previous = len(runs) if settled else -1
            time.sleep(0.5)


#: One task per batch, nothing sent ahead: for tests that name task runs or fault a unit by its last batch (the
#: default, automatic grain sizes units from measured step times).
PER_BATCH = {"batches_per_task": 1, "pipeline_depth": 0}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_span_full_run_matches_direct_run_and_reports(space: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    original = checkpoint_tasks.emit_event
    monkeypatch.setattr(checkpoint_tasks, "emit_event", lambda **kw: events.append(kw) or original(**kw))
    adopted: list[Any] = []  # the spare worker train_flow starts ahead is the process its run's worker uses
    take = worker_module.take_spare
    monkeypatch.setattr(worker_module, "take_spare", lambda: adopted.append(take()) or adopted[-1])
    started = _spares_started_by_the_call(monkeypatch)
    storage = space["root"] / "runs"
    summary = run_flow(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        run_key="span-full",
        storage=str(storage),
        # every checkpoint kept: the layout below lists them all
        checkpointing={"checkpoint_every": 2, "keep_checkpoints": None},
    )
    reference = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "ref-span-full")
    assert_same_export(summary["export"], reference)
    assert summary["label"] == "best" and summary["total_steps"] == 6 and summary["worker_starts"] == 1
    assert len(adopted) == 1 and adopted[0] is not None and spare.spare_pid() is None
    assert started == [(False, adopted[0][0].pid)]  # the call started it, before Prefect created the flow run
    run = storage / "span-full"
    names = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != layout.BLOB_DIR)
    assert names == [
        "step-000002-batch-000003",
        "step-000003-batch-000005",
        "step-000004-batch-000007",
        "step-000006-batch-000011",
    ]
    cursor = json.loads((run / "cursor.json").read_text())
    assert (cursor["checkpoint"], cursor["cursor"], cursor["finished"]) == (names[-1], 12, True)
    assert cursor["export"] == summary["export"] == str(run / "export")
    for path in (run, run / "checkpoints", run / "checkpoints" / names[0]):
        assert _mode(path) == 0o700, path
    for path in (
        run / "manifest.json",
        run / "cursor.json",
        run / "run.json",
        run / "checkpoints" / names[0] / "weights.safetensors",
    ):
        assert _mode(path) == 0o600, path
    assert [e["payload"]["name"] for e in events] == names
    assert events[0]["resource"]["prefect.resource.id"] == "prefect-gliner2.run.span-full"
    _assert_ui(summary["flow_run_id"])
    again = run_flow(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        run_key="span-full",
        storage=str(storage),
        # every checkpoint kept: the layout below lists them all
        checkpointing={"checkpoint_every": 2, "keep_checkpoints": None},
    )
    assert again["worker_starts"] == 0 and again["export"] == summary["export"]  # complete: nothing to do
    assert len(adopted) == 1
    assert_no_spare_left()  # its spare was killed unused


def _spares_started_by_the_call(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int | None]]:
    """Each spare worker a call of train_flow starts (``flows.spare_first``): (whether a flow run existed then,
    the spare's pid)."""
    from prefect.context import FlowRunContext

    from prefect_gliner2.flows import spare_first

    started: list[tuple[bool, int | None]] = []
    prestart = spare_first.prestart_worker

    def recorded() -> bool:
        inside = FlowRunContext.get() is not None
        result = prestart()
        started.append((inside, spare.spare_pid()))
        return result

    monkeypatch.setattr(spare_first, "prestart_worker", recorded)
    return started


def _assert_ui(flow_run_id: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(flow_run_id))
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
        )
        deadline = time.monotonic() + 20  # labels are patched best effort, in the background
        while flow_run.labels.get("prefect-gliner2.step") != 6 and time.monotonic() < deadline:
            time.sleep(0.2)
            flow_run = client.read_flow_run(UUID(flow_run_id))
    assert "batch 12/12" in flow_run.name and "step 6/6" in flow_run.name
    assert flow_run.labels["prefect-gliner2.step"] == 6 and flow_run.labels["prefect-gliner2.run-key"] == "span-full"
    kinds = {a.key: a for a in sorted(artifacts, key=lambda a: a.created)}  # the newest version of each key
    assert kinds["gliner2-span-full-progress"].data == 100.0
    markdown = kinds["gliner2-span-full-summary"].data
    assert "best eval_f1" in markdown and "**best F1**" in markdown and "| step | epoch | precision |" in markdown
    table = json.loads(kinds["gliner2-span-full-validation"].data)
    assert [row["step"] for row in table] == [3, 6] and [row["epoch"] for row in table] == [1, 2]  # 1-based epochs
    assert {"eval_precision", "eval_recall", "eval_f1", "eval_entity_f1", "eval_macro_f1", "eval_loss"} <= set(table[0])
    assert {f"{label} P / R / F1" for label in TINY_ENTITY_TYPES} <= set(table[0])


def test_boundary_lora_grouped_and_pipelined_matches_direct_run(space: dict[str, Any], tmp_path: Path) -> None:
    """Groups of 3 batches, operations sent 2 units ahead, and a worker SIGKILL with operations in flight."""
    cfg = training_config(use_lora=True)
    # The first worker waits at batch 9 until the flow's task for batches 8-10 has joined the pre-sent operation
    # (without the pause the kill can land before that task starts, and then nothing is retried), then dies.
    plan = FaultPlan(
        (
            Fault.pause("batch", 9, 3.0, once=str(tmp_path / "paused")),
            Fault.kill("batch", 9, once=str(tmp_path / "died")),
        )
    )
    with installed_faults(plan):
        summary = run_flow(
            model=space["boundary"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=cfg,
            run_key="boundary-lora",
            storage=str(space["root"] / "runs"),
            checkpointing={"checkpoint_every": 2, "keep_checkpoints": None},
            execution={"batches_per_task": 3, "pipeline_depth": 2},
        )
    reference = reference_export(space["boundary"], space["inputs"], cfg, space["root"] / "ref-boundary-lora")
    assert (Path(summary["export"]) / "adapter").is_dir()
    assert_same_export(summary["export"], reference)
    runs = _task_runs(summary["flow_run_id"])
    names = {t.name for t in runs}
    assert {"batches 0-2", "batches 3-3", "checkpoint step 2 batch 3", "batches 8-10", "export best model"} <= names
    assert summary["worker_starts"] == 2 and [t.name for t in runs if t.run_count > 1] == ["batches 8-10"]
    folder = space["root"] / "runs" / "boundary-lora" / "checkpoints"
    checkpoints = sorted(p.name for p in folder.iterdir() if p.name != layout.BLOB_DIR)
    assert checkpoints == [
        "step-000002-batch-000003",
        "step-000003-batch-000005",
        "step-000004-batch-000007",
        "step-000006-batch-000011",
    ]


def test_worker_death_and_transient_errors_are_retried_exactly(space: dict[str, Any], tmp_path: Path) -> None:
    cfg = training_config(use_lora=True)
    plan = FaultPlan(
        (Fault.kill("batch", 4, once=str(tmp_path / "died")), Fault.fail("batch", 9, once=str(tmp_path / "raised")))
    )
    with installed_faults(plan):
        summary = run_flow(
            model=space["span"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=cfg,
            run_key="span-lora-faults",
            storage=str(space["root"] / "runs"),
            checkpointing={"checkpoint_every": 1},
            execution=PER_BATCH,  # the retried task names below are per-batch units
        )
    assert (tmp_path / "died").exists() and (tmp_path / "raised").exists()
    assert summary["worker_starts"] == 3
    retried = sorted(t.name for t in _task_runs(summary["flow_run_id"]) if t.run_count > 1)
    assert retried == ["batches 4-4", "batches 9-9"]
    assert_same_export(
        summary["export"], reference_export(space["span"], space["inputs"], cfg, space["root"] / "ref-span-lora")
    )


def test_flow_retry_reuses_the_live_worker_and_its_cache(space: dict[str, Any], tmp_path: Path) -> None:
    from prefect_gliner2.flows.train import train_flow

    with installed_faults(FaultPlan((Fault.fail("unit", 8, once=str(tmp_path / "raised")),))):
        summary = train_flow.with_options(retries=1)(
            model=space["span"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=training_config(),
            run_key="span-flow-retry",
            storage=str(space["root"] / "runs"),
            checkpointing={"checkpoint_every": 0},
            execution={"cpu_threads": 1, **PER_BATCH},  # the fault and the cached names are per-batch units
        )
    assert (tmp_path / "raised").exists() and summary["worker_starts"] == 1
    assert summary["resumed_from_batch"] == 6  # the epoch-end checkpoint after batch 5
    cached = sorted(t.name for t in _task_runs(summary["flow_run_id"]) if t.state.name == "Cached")
    assert cached == ["batches 6-6", "batches 7-7", "batches 8-8"]  # same worker incarnation: correct to reuse
    reference = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "ref-span-full")
    assert_same_export(summary["export"], reference)


def test_a_cache_hit_after_restore_cannot_skip_work(
    space: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Force cache collisions across worker restarts: the hits are harmless because operations are positions."""
    monkeypatch.setattr(SessionWorker, "incarnation", property(lambda self: "constant" if self.alive else None))
    params = dict(
        model=space["span"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=training_config(),
        run_key="span-cache",
        storage=str(space["root"] / "runs"),
        checkpointing={"checkpoint_every": 0},
        execution=PER_BATCH,  # the fault and the cached names are per-batch units
    )
    with installed_faults(FaultPlan((Fault.fail("unit", 9, once=str(tmp_path / "raised")),))):
        with pytest.raises(RuntimeError, match="injected transient failure"):
            run_flow(**params)
    summary = run_flow(**params)
    assert summary["resumed_from_batch"] == 6 and summary["worker_starts"] == 1
    runs = {t.name: t for t in _task_runs(summary["flow_run_id"])}
    assert [runs[f"batches {i}-{i}"].state.name for i in range(6, 11)] == ["Cached"] * 4 + ["Completed"]
    with_replay = runs["batches 10-10"].state.result()  # the task's persisted AdvanceResult
    assert (
        isinstance(with_replay, AdvanceResult) and with_replay.replayed == 4
    )  # batches 6-9 were skipped by the cache and replayed by the worker
    reference = reference_export(space["span"], space["inputs"], training_config(), space["root"] / "ref-span-full")
    assert_same_export(summary["export"], reference)


def test_cache_key_changes_with_every_worker_incarnation(space: dict[str, Any]) -> None:
    from prefect_gliner2.runtime import live_runs
    from prefect_gliner2.tasks.training import position_cache_key

    class Worker:
        incarnation = "step-000003-batch-000005@aaaa"

    class Context:
        class task:  # noqa: N801 - mimics TaskRunContext.task
            name = "train-batches"

    live = live_runs.LiveRun("k", None, "fp", "ca", Worker(), None)  # type: ignore[arg-type]
    live_runs.register(live)
    try:
        params = {"run_key": "k", "first": 6, "through": 6}
        first = position_cache_key(Context, params)
        Worker.incarnation = "step-000003-batch-000005@bbbb"  # same checkpoint, new worker process
        assert position_cache_key(Context, params) != first
        assert position_cache_key(Context, {**params, "through": 7}) != position_cache_key(Context, params)
        Worker.incarnation = None  # type: ignore[assignment]  (no live worker: no caching at all)
        assert position_cache_key(Context, params) is None
    finally:
        live_runs.unregister("k", close=False)


def test_early_stopping_is_checkpointed_and_exports_the_best(space: dict[str, Any]) -> None:
    cfg = training_config(
        eval_strategy="steps",
        eval_steps=1,
        early_stopping=True,
        early_stopping_patience=1,
        early_stopping_threshold=1e9,
    )
    summary = run_flow(
        model=space["boundary"],
        train_data=space["inputs"]["train"],
        valid_data=space["inputs"]["valid"],
        config=cfg,
        run_key="boundary-early",
        storage=str(space["root"] / "runs"),
        checkpointing={"checkpoint_every": 0},
    )
    assert summary["stopped_early"] and summary["total_steps"] == 2
    cursor = json.loads((space["root"] / "runs" / "boundary-early" / "cursor.json").read_text())
    assert cursor["finished"] and cursor["checkpoint"] == "step-000002-batch-000003"
    reference = reference_export(space["boundary"], space["inputs"], cfg, space["root"] / "ref-boundary-early")
    assert_same_export(summary["export"], reference)


def test_refusals(space: dict[str, Any]) -> None:
    storage = str(space["root"] / "refusals")
    base = dict(model=space["span"], train_data=space["inputs"]["train"], config=training_config(), storage=storage)
    for bad in ("../x", "a/b", "", ".hidden", "x" * 129, "semi;colon"):
        with pytest.raises(RunKeyError, match="invalid run key"):
            run_flow(**base, run_key=bad)
    other = ManagedTrainingPlan(
        tiny_records(10, seed=1), TrainingConfig.from_dict(training_config()), architecture="span"
    )
    run_dir = RunDirectory(storage, "taken")
    run_dir.create()
    run_dir.ensure_manifest(other.manifest_bytes())
    with pytest.raises(RunConflictError, match="already holds a different manifest.*training data or plan"):
        run_flow(**base, run_key="taken")
    busy = RunDirectory(storage, "busy")
    busy.create()
    with RunLease(busy, flow_run_id="someone-else"), pytest.raises(RunLockedError, match="in use by another live run"):
        run_flow(**base, run_key="busy", lease={"lease_wait": 0})
    assert not any(name.startswith("step-") for name in os.listdir(busy.path + "/checkpoints"))


def test_a_tampered_only_checkpoint_fails_at_once_without_retries(space: dict[str, Any]) -> None:
    """A damaged restore point with no intact earlier checkpoint is a deterministic error: the flow stops before
    any task runs, with a clear message (a damaged checkpoint with an intact predecessor is recovered instead:
    tests/test_chaos.py, tests/test_rundir_recovery.py)."""
    import shutil

    from prefect_gliner2.session_core.errors import CheckpointError

    storage = space["root"] / "runs"
    source = storage / "span-full"  # the finished run of the first test in this file, when it ran in this session
    if (source / "cursor.json").exists():
        shutil.copytree(source, storage / "span-tampered", ignore=shutil.ignore_patterns("export", ".lease"))
    else:  # run alone: train the same run under this key first
        run_flow(
            model=space["span"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=training_config(),
            run_key="span-tampered",
            storage=str(storage),
            # the checkpoint tampered with below must still be there
            checkpointing={"checkpoint_every": 2, "keep_checkpoints": None},
        )
        shutil.rmtree(storage / "span-tampered" / "export")
    run = storage / "span-tampered"
    cursor = json.loads((run / "cursor.json").read_text())
    cursor.update(
        checkpoint="step-000002-batch-000003", cursor=4, step=2, epoch=0, finished=False, export=None, summary=None
    )
    (run / "cursor.json").write_text(json.dumps(cursor))
    weights = run / "checkpoints" / "step-000002-batch-000003" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
    with pytest.raises(CheckpointError, match="does not match its recorded blake3.*no intact earlier checkpoint"):
        run_flow(
            model=space["span"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=training_config(),
            run_key="span-tampered",
            storage=str(storage),
            checkpointing={"checkpoint_every": 2},
        )
    flow_run_id = json.loads((run / ".lease").read_text())["flow_run_id"]
    assert [t for t in _task_runs(flow_run_id) if t.name.startswith("batches")] == []
    assert json.loads((run / "cursor.json").read_text())["checkpoint"] == "step-000002-batch-000003"


# ---- run directory and durable cursor (no training; the lease and the schedule: test_lease.py, test_schedule.py) -----


def test_durable_cursor_only_moves_forward_and_debris_is_removed(tmp_path: Path) -> None:
    from prefect_gliner2.runtime.rundir import DurableCursor

    run_dir = RunDirectory(str(tmp_path), "r")
    run_dir.create()

    def at(cursor: int, **extra: Any) -> DurableCursor:
        return DurableCursor(
            checkpoint=f"c{cursor}", cursor=cursor, step=cursor, epoch=0, finished=False, fingerprint="fp", **extra
        )

    assert run_dir.commit_cursor(at(4)) and run_dir.read_cursor().cursor == 4  # type: ignore[union-attr]
    assert not run_dir.commit_cursor(at(2)) and not run_dir.commit_cursor(at(4))
    assert run_dir.commit_cursor(at(8)) and run_dir.newest_checkpoint_uri() == run_dir.checkpoint_uri("c8")
    assert run_dir.commit_cursor(at(8, export="/x")) and run_dir.read_cursor().export == "/x"  # type: ignore[union-attr]
    with pytest.raises(RunConflictError, match="belongs to plan"):
        run_dir.commit_cursor(DurableCursor("c9", 9, 9, 0, False, "other-plan"))
    (tmp_path / "r" / "checkpoints" / ".step-000001-batch-000001.partial-1-ab").mkdir()
    (tmp_path / "r" / ".cursor.json.x.tmp").write_text("")
    assert sorted(run_dir.remove_debris()) == [".cursor.json.x.tmp", ".step-000001-batch-000001.partial-1-ab"]
    assert _mode(tmp_path / "r") == 0o700 and _mode(tmp_path / "r" / "cursor.json") == 0o600


def test_validation_best_f1_equals_the_f1_of_the_exported_best_model(space: dict[str, Any]) -> None:
    """The best eval_f1 a flow reports is what gliner2's public API extracts with the exported best model."""
    from gliner2 import AutoExtractor

    from prefect_gliner2.session_core.label_order import shuffle_schema

    from support.flow import make_inputs

    inputs = make_inputs(space["root"] / "data-f1", n_train=48, n_valid=16)
    threshold = 0.3
    cfg = training_config(
        batch_size=8,
        gradient_accumulation_steps=1,
        num_epochs=8,
        encoder_lr=5e-3,
        task_lr=2e-2,
        warmup_ratio=0.1,
        eval_threshold=threshold,
    )
    summary = run_flow(
        model=space["span"],
        train_data=inputs["train"],
        valid_data=inputs["valid"],
        config=cfg,
        run_key="span-f1",
        storage=str(space["root"] / "runs"),
        checkpointing={"checkpoint_every": 100},
        execution={"batches_per_task": 6},
    )
    assert summary["metric_for_best"] == "eval_f1" and summary["label"] == "best"
    records = [json.loads(line) for line in Path(inputs["valid"]).read_text().splitlines()]
    model = AutoExtractor.from_pretrained(summary["export"])
    labels = list(DatasetSchema.of([r["output"] for r in records]).entities)  # the data's labels
    # validation asks each record's labels in its own seeded order (the config's seed, trial 0): so does this check
    orders = [
        shuffle_schema({"entities": labels}, seed=cfg["seed"], position=i)["entities"] for i in range(len(records))
    ]
    extracted = [
        model.batch_extract_entities([r["input"]], order, threshold=threshold)[0]
        for r, order in zip(records, orders, strict=True)
    ]
    fresh = score_records([r["output"] for r in records], extracted).total()
    assert fresh.tp > 0 and summary["best_metric"] > 0  # the model really extracts: not a 0 == 0 comparison
    one_item = max(abs(fresh.f1 - c.f1) for c in _one_item_away(fresh))
    assert abs(summary["best_metric"] - fresh.f1) <= one_item, (summary["best_metric"], fresh)


def _one_item_away(c: Counts) -> list[Counts]:
    """Counts that differ from `c` by one extracted item (one more or one fewer true or false positive)."""
    moves = [(1, 0, -1), (-1, 0, 1), (0, 1, 0), (0, -1, 0)]
    return [Counts(c.tp + a, c.fp + b, c.fn + d) for a, b, d in moves if min(c.tp + a, c.fp + b, c.fn + d) >= 0]
