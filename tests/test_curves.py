"""Training curves in the Prefect UI: the SVG chart writer draws exactly the points it is given, and a run's
``gliner2-<run key>-curves`` markdown artifact shows its loss, learning rate and validation F1 (overall and per
label) against steps while it runs, and after a crash and resume the whole run's points, each step once, in the same
artifact."""

from __future__ import annotations

import base64
import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.report_text import artifact_key
from prefect_gliner2.flows.svg_chart import Series, line_chart, nice_ticks, thin
from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.flow import flow_child, make_space, run_flow, space_params, wait_for_marker
from support.history import recorded_history
from support.processes import kill9

SVG = "{http://www.w3.org/2000/svg}"


def drawn_points(svg: str) -> dict[str, list[tuple[float, float]]]:
    """Every series of a chart, its pixels mapped back to data values through the plot rect's ranges."""
    root = ET.fromstring(svg)
    plot = root.find(f"{SVG}rect[@class='plot']")
    assert plot is not None, "the chart has no plot area"
    left, top = float(plot.get("x", 0)), float(plot.get("y", 0))
    width, height = float(plot.get("width", 0)), float(plot.get("height", 0))
    x0, x1 = map(float, plot.get("data-x-range", "").split())
    y0, y1 = map(float, plot.get("data-y-range", "").split())
    found = {}
    for line in root.iter(f"{SVG}polyline"):
        pairs = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
        found[line.get("data-name", "")] = [
            (x0 + (px - left) / width * (x1 - x0), y0 + (top + height - py) / height * (y1 - y0)) for px, py in pairs
        ]
    return found


def charts(markdown: str) -> dict[str, str]:
    """The SVG documents of a curves artifact by their alt text."""
    images = re.findall(r"!\[([^\]]*)\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown)
    return {alt: base64.b64decode(data).decode() for alt, data in images}


def close(a: float, b: float, span: float) -> bool:
    return abs(a - b) <= span * 1e-3


def test_a_chart_draws_exactly_its_points() -> None:
    loss = [(s, 2.0 / s) for s in range(1, 41)]
    rate = [(s, 1e-3 * s) for s in range(1, 41, 3)]
    svg = line_chart([Series("loss", loss), Series("rate <x>", rate), Series("empty", [])], title="A & B")
    found = drawn_points(svg)
    assert set(found) == {"loss", "rate <x>"}  # names escaped in XML, an empty series not drawn
    for name, expected in (("loss", loss), ("rate <x>", rate)):
        assert len(found[name]) == len(expected)
        for (x, y), (ex, ey) in zip(found[name], expected, strict=True):
            assert close(x, ex, 40) and close(y, ey, 2.0), (name, x, y, ex, ey)
    ticks = nice_ticks(0.013, 0.87)
    assert ticks[0] <= 0.013 and ticks[-1] >= 0.87 and len(ticks) <= 8
    kept = thin(list(range(1000)), 7)
    assert len(kept) == 7 and kept[0] == 0 and kept[-1] == 999  # the ends kept, evenly strided between
    assert all(abs((b - a) - 999 / 6) <= 1 for a, b in zip(kept, kept[1:], strict=False))
    assert thin(list(range(5)), 7) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="not finite"):
        nice_ticks(0.0, float("nan"))


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("curves"))


def _curves_artifact(run_key: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        key = artifact_key(run_key, "curves")
        return list(client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))))


def _steps_shown(markdown: str) -> list[float]:
    loss = charts(markdown).get("loss")  # none before the first step
    return [round(x) for x, _ in drawn_points(loss).get("training loss", [])] if loss else []


@pytest.mark.usefixtures("prefect_server")
def test_the_curves_follow_a_run_through_a_crash_and_resume(space: dict[str, Any], prefect_server: str) -> None:
    params = space_params(space, "curves-crash")
    markers = space["root"] / "markers"
    markers.mkdir()
    # paused (then killed) at batch 8, after the checkpoint at batch 7 (step 4) and the epoch-1 validation
    process = flow_child(params, FaultPlan((Fault.pause("batch", 8, 120),), markers=str(markers)), prefect_server)
    try:
        wait_for_marker(markers, "batch-8", process)
        deadline = time.monotonic() + 30
        while not (found := _curves_artifact("curves-crash")) or _steps_shown(found[0].data) != [1, 2, 3, 4]:
            assert time.monotonic() < deadline, f"the running run's curves never showed steps 1-4: {found}"
            time.sleep(0.5)
    finally:
        kill9(process)
    [running] = found
    assert "validation F1" in charts(running.data)  # the epoch-1 validation is on the curves already
    summary = run_flow(**params)
    [final] = _curves_artifact("curves-crash")
    assert final.id == running.id, "the resumed run continues the crashed run's curves artifact"
    run_dir = Path(summary["run_dir"])
    newest = sorted((run_dir / "checkpoints").iterdir())[-1]
    train, evaluations = recorded_history(newest)  # the whole run's recorded history (resume is exact)
    images = charts(final.data)
    loss = drawn_points(images["loss"])
    assert [round(x) for x, _ in loss["training loss"]] == [e["step"] for e in train] == [1, 2, 3, 4, 5, 6]
    span = max(e["loss"] for e in train) - min(e["loss"] for e in train)
    assert all(close(y, e["loss"], span) for (_, y), e in zip(loss["training loss"], train, strict=True))
    assert [round(x) for x, _ in loss["validation loss"]] == [3, 6]
    [rate] = drawn_points(images["learning rate"]).values()
    rates = [e["learning_rate"] for e in train]
    assert all(close(y, r, max(rates)) for (_, y), r in zip(rate, rates, strict=True))
    f1 = drawn_points(images["validation F1"])
    labels = {row["label"] for row in evaluations[-1]["per_label_fitted"]}
    overall = {"micro F1 (fitted)", "macro F1 (fitted)", "micro F1 at eval_threshold", "macro F1 at eval_threshold"}
    assert set(f1) == overall | labels and labels, f1.keys()
    for name, key in (("micro F1 (fitted)", "eval_f1_fitted"), ("macro F1 at eval_threshold", "eval_macro_f1")):
        assert [y for _, y in f1[name]] == pytest.approx([e[key] for e in evaluations], abs=1e-3)
    assert "step **6** of 6" in final.data and "2 validation(s)" in final.data
    assert json.loads((run_dir / "cursor.json").read_text())["step"] == 6
