"""What the Prefect UI shows is never stale: a finished run's labels, name and state message are its final position
the moment the flow returns (while it runs, its name and labels follow the cursor); each run key has one progress,
one validation and one summary artifact, updated in place, also across a crash and a resumed run; numbers are
rounded and epochs 1-based; the run's events tell the same story."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.flows.report_text import NAME_LABEL, RESUMED_BY_LABEL, RESUMES_LABEL, artifact_key
from prefect_gliner2.runtime.events import CHECKPOINT_COMMITTED
from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.flow import flow_child, installed_faults, make_space, run_flow, space_params, wait_for_marker
from support.processes import kill9

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("ui"))


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _artifacts(key: str) -> list[Any]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with _client() as client:
        return list(client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))))


def _params(space: dict[str, Any], run_key: str) -> dict[str, Any]:
    return space_params(space, run_key)


def test_a_finished_runs_labels_name_and_message_are_its_final_position(space: dict[str, Any]) -> None:
    # the first batch takes 3 s: the tiny run is otherwise over in about a second (its worker forked ready in a
    # fraction of one), before the background lane has shown any position, and the first one shown is the start
    with installed_faults(FaultPlan((Fault.pause("batch", 0, 3.0),))):
        summary = run_flow(**_params(space, "ui-final"))
    cursor = json.loads((space["root"] / "runs" / "ui-final" / "cursor.json").read_text())
    with _client() as client:  # read at once: no waiting for a background update
        flow_run = client.read_flow_run(UUID(summary["flow_run_id"]))
        states = client.read_flow_run_states(UUID(summary["flow_run_id"]))
    # the state message followed the cursor (one Running state per message) without counting new attempts
    assert flow_run.run_count == 1, "position messages must not use up the flow's retries"
    running = [s.message or "" for s in states if s.type.value == "RUNNING"]
    assert len(running) >= 2 and running[0] == "", running  # the engine's own Running state, then ours
    batches = [int(re.search(r"batch (\d+)/12", m).group(1)) for m in running[1:]]  # type: ignore[union-attr]
    assert batches == sorted(batches) and batches[0] == 0, running  # (a tiny run: later ones may coalesce)
    assert all(m.startswith("ui-final: epoch ") for m in running[1:]), running
    labels = flow_run.labels
    assert (labels["prefect-gliner2.batch"], labels["prefect-gliner2.step"]) == (cursor["cursor"], cursor["step"])
    assert (cursor["cursor"], cursor["step"], labels["prefect-gliner2.epoch"]) == (12, 6, 2)
    assert labels["prefect-gliner2.run-key"] == "ui-final"
    generated = labels[NAME_LABEL]
    assert generated and not generated.startswith("ui-final"), "Prefect's generated name stays visible"
    assert flow_run.name.startswith("ui-final · epoch 2/2 · batch 12/12 · step 6/6 · loss ")
    assert flow_run.name.endswith(" · done")
    assert flow_run.state is not None and flow_run.state.is_completed()
    message = flow_run.state.message or ""
    assert "epoch 2/2 · batch 12/12 · step 6/6" in message and summary["export"] in message
    [summary_artifact] = _artifacts(artifact_key("ui-final", "summary"))
    assert generated in summary_artifact.data and summary["flow_run_id"] in summary_artifact.data
    [table] = _artifacts(artifact_key("ui-final", "validation"))
    rows = json.loads(table.data)
    assert [(r["epoch"], r["step"], r["batch"]) for r in rows] == [(1, 3, 5), (2, 6, 11)]  # 1-based epochs
    for row in rows:
        assert row["eval_loss"] == float(f"{row['eval_loss']:.6g}")  # rounded to 6 significant digits


def _crash_at(
    params: dict[str, Any], point: str, markers: Path, api_url: str, *, delivered: tuple[str, int], message: str
) -> None:
    """SIGKILL the flow process paused at `point`, once the server has the event `delivered` (events a process
    emits just before it is killed may be lost with it: that is no part of what is tested here) and the running
    flow run's state message contains `message`."""
    markers.mkdir(parents=True)
    name, index = point.rsplit(":", 1)
    process = flow_child(params, FaultPlan((Fault.pause(name, int(index), 120),), markers=str(markers)), api_url)
    try:
        wait_for_marker(markers, f"{name}-{index}", process)
        [started] = _events(params["run_key"], *delivered)[:1]
        flow_run_id = UUID(started.payload["flow_run_id"])
        deadline = time.monotonic() + 30
        with _client() as client:
            while message not in ((state := client.read_flow_run(flow_run_id).state) and state.message or ""):
                assert time.monotonic() < deadline, f"the running state message never showed {message!r}"
                time.sleep(0.5)
            assert state is not None and state.is_running()
    finally:
        kill9(process)


def _events(run_key: str, until: str, cursor: int | None = None, timeout: float = 60.0) -> list[Any]:
    """The run key's events in order, once `until` (at `cursor`, if given) has arrived (the server persists
    events in batches)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventOrder, EventResourceFilter

    query = EventFilter(
        event=EventNameFilter(prefix=["prefect-gliner2."]),
        resource=EventResourceFilter(id=[f"prefect-gliner2.run.{run_key}"]),
        order=EventOrder.ASC,
    )
    deadline = time.monotonic() + timeout
    with _client() as client:
        while True:
            events = list(client.read_events(filter=query, limit=50).events)
            arrived = [e for e in events if e.event == until and cursor in (None, e.payload.get("cursor"))]
            if arrived or time.monotonic() > deadline:
                return sorted(events, key=lambda e: e.occurred)
            time.sleep(1)


def test_crash_and_resume_continue_one_set_of_artifacts_and_tell_in_events(
    space: dict[str, Any],
    prefect_server: str,
) -> None:
    params = _params(space, "ui-crash")
    # killed at batch 8, after the checkpoint at batch 7
    # ... its state message following the cursor while it runs (set at the checkpoint)
    markers = space["root"] / "markers"
    _crash_at(params, "batch:8", markers, prefect_server, delivered=(CHECKPOINT_COMMITTED, 8), message="batch 8/12")
    crashed = json.loads((space["root"] / "runs" / "ui-crash" / ".lease").read_text())["flow_run_id"]
    [progress] = _artifacts(artifact_key("ui-crash", "progress"))
    assert 0 < progress.data < 100
    summary = run_flow(**params)
    resumed = summary["flow_run_id"]
    assert resumed != crashed and summary["resumed_from_batch"] == 8
    [again] = _artifacts(artifact_key("ui-crash", "progress"))
    assert again.id == progress.id and again.data == 100.0  # the crashed run's artifact, continued
    [table] = _artifacts(artifact_key("ui-crash", "validation"))
    assert [r["epoch"] for r in json.loads(table.data)] == [1, 2]
    assert len(_artifacts(artifact_key("ui-crash", "summary"))) == 1
    with _client() as client:
        assert client.read_flow_run(UUID(resumed)).labels[RESUMES_LABEL] == crashed
        deadline = time.monotonic() + 60  # another run's labels are patched in the background (later when busy)
        while client.read_flow_run(UUID(crashed)).labels.get(RESUMED_BY_LABEL) != resumed:
            assert time.monotonic() < deadline, "the crashed run does not point at the run that resumed it"
            time.sleep(0.5)

    events = _events("ui-crash", "prefect-gliner2.run.completed")
    sequence = [(e.event.removeprefix("prefect-gliner2."), e.payload.get("flow_run_id")) for e in events]
    assert sequence == [
        ("run.started", crashed),
        ("checkpoint.committed", crashed),  # batch 3
        ("validation.completed", crashed),  # the end of epoch 1
        ("checkpoint.committed", crashed),  # batch 5
        ("checkpoint.committed", crashed),  # batch 7; killed at batch 8
        ("run.resumed", resumed),
        ("validation.completed", resumed),  # the end of epoch 2
        ("checkpoint.committed", resumed),  # batch 11
        ("run.completed", resumed),
    ], sequence
    by_name = {e.event.removeprefix("prefect-gliner2."): e.payload for e in events}
    assert by_name["run.resumed"]["resumes_flow_run"] == crashed
    assert by_name["run.resumed"]["checkpoint"].endswith("checkpoints/step-000004-batch-000007")
    assert set(by_name["validation.completed"]["metrics"]) >= {"eval_loss"}
    assert by_name["run.completed"]["export"] == summary["export"]
    for payload in by_name.values():
        for key in ("run_dir", "export", "checkpoint", "uri", "manifest"):
            if isinstance(payload.get(key), str):
                assert payload[key].startswith("/"), (key, payload[key])  # absolute


def test_a_failed_run_emits_run_failed(space: dict[str, Any], tmp_path: Path) -> None:
    params = {**_params(space, "ui-failed"), "init_weights": str(tmp_path)}  # a directory without weights
    with pytest.raises(Exception):  # noqa: B017 - which error is the bad-input suite's business
        run_flow(**params)
    events = _events("ui-failed", "prefect-gliner2.run.failed")
    failed = [e for e in events if e.event == "prefect-gliner2.run.failed"]
    assert failed and failed[0].payload["error"] and failed[0].payload["run_dir"].startswith("/")
