"""`bench/flow_sliced.py`'s accounting on synthetic timelines (no processes): running time counted only inside a
side's own slices, counts interpolated in running time, blocks between the flow's marks; and the flow script's
correction that keeps stopped time out of what the automatic grain measures."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import flow  # noqa: E402
import flow_sliced  # noqa: E402


def timeline(
    name: str, slices: list[tuple[float, float]], per_batch: float, mark_every: int, slow: tuple[float, float] = (0, 0)
) -> flow_sliced.Timeline:
    """A side that trains one batch per `per_batch` seconds of running time, only inside `slices` (a batch cut by a
    stop finishes in its next slice), `slow`: (from, to) wall seconds during which its batches take twice as long;
    it marks its count every `mark_every` batches. Simulated in whole microseconds (no rounding drift)."""
    us = 1_000_000
    side = flow_sliced.Timeline(name)
    side.slices = slices
    batch, left, done = round(per_batch * us), round(per_batch * us), 0  # `left`: work of this batch, in us
    slow_from, slow_to = round(slow[0] * us), round(slow[1] * us)
    for start, end in slices:
        a, b = round(start * us), round(end * us)
        edges = sorted({a, b, *(x for x in (slow_from, slow_to) if a < x < b)})
        for lo, hi in zip(edges, edges[1:], strict=False):
            pace = 2 if slow_from <= lo < slow_to else 1
            while lo + left * pace <= hi:
                lo, left, done = lo + left * pace, batch, done + 1
                if done % mark_every == 0:
                    side.marks.append((lo / us, done))
            left -= (hi - lo) // pace
    return side


def test_running_time_counts_only_a_sides_own_slices() -> None:
    side = flow_sliced.Timeline("x")
    side.slices = [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    assert side.running(0.5) == pytest.approx(0.5)
    assert side.running(1.7) == pytest.approx(1.0)  # stopped from 1 to 2
    assert side.running(2.25) == pytest.approx(1.25)
    assert side.running(99.0) == pytest.approx(3.0)


def test_each_sides_cost_per_batch_and_their_ratio_per_block() -> None:
    turns = [(float(t), t + 0.5) for t in range(0, 400)]  # native runs in the first half of every second
    native = timeline("native", turns, per_batch=0.010, mark_every=1)
    flowside = timeline("flow", [(a + 0.5, b + 0.5) for a, b in turns], per_batch=0.0125, mark_every=400)
    figures = flow_sliced.measure(native, flowside, block=15.0)
    assert figures["native_s"] == pytest.approx(0.010, rel=1e-6)
    assert figures["flow_s"] == pytest.approx(0.0125, rel=1e-6)
    assert figures["ratio"] == pytest.approx(1.25, rel=1e-6)
    # the flow's marks every 5 s of its running time, from 5 s; the last (at 400.0 by the wall clock) is past the
    # native's last (399.5): 190 s of the flow's running time between its marks, in blocks of >= 15 s
    assert len(figures["block_ratios"]) == 12
    assert figures["block_ratios"] == pytest.approx([1.25] * 12, rel=1e-3)
    assert {batches for batches, _ in figures["flow_units"]} == {400}  # 5 s of running at 12.5 ms
    assert all(seconds == pytest.approx(5.0) for _, seconds in figures["flow_units"])


def test_the_flows_marks_past_the_natives_last_are_left_out() -> None:
    """The flow's turn comes last, so its last mark can fall after the native's last: no count of the native's is
    known there, and the whole window ends at the flow's last mark before it."""
    turns = [(float(t), t + 0.5) for t in range(0, 100)]
    native = timeline("native", turns, per_batch=0.030, mark_every=1)  # its last mark at 99.47, before its turn ends
    flowside = timeline("flow", [(a + 0.5, b + 0.5) for a, b in turns], per_batch=0.0125, mark_every=40)
    assert flowside.marks[-1][0] > native.marks[-1][0]
    figures = flow_sliced.measure(native, flowside, block=5.0)
    assert figures["ratio"] == pytest.approx(0.0125 / 0.030, rel=1e-3)
    assert figures["block_ratios"] == pytest.approx([0.0125 / 0.030] * len(figures["block_ratios"]), rel=1e-2)


def test_a_slower_stretch_on_both_sides_leaves_the_ratio() -> None:
    """The host slows down for a while: both sides' turns in that while are slower alike; the ratio stays."""
    turns = [(float(t), t + 0.5) for t in range(0, 200)]
    slow = (60.0, 100.0)
    native = timeline("native", turns, per_batch=0.010, mark_every=1, slow=slow)
    flowside = timeline("flow", [(a + 0.5, b + 0.5) for a, b in turns], per_batch=0.0105, mark_every=400, slow=slow)
    figures = flow_sliced.measure(native, flowside, block=10.0)
    assert figures["native_s"] > 0.0105  # the slow stretch is in both sides' figures...
    assert figures["ratio"] == pytest.approx(1.05, rel=2e-3)  # ...and out of their ratio
    # a block holding an edge of the slow stretch has it for up to one turn longer on one side than on the other
    ratios = sorted(figures["block_ratios"])
    assert ratios[1:-1] == pytest.approx([1.05] * (len(ratios) - 2), rel=2e-3)
    assert ratios[0] == pytest.approx(1.05, rel=0.05) and ratios[-1] == pytest.approx(1.05, rel=0.05)


def test_the_flow_script_takes_stopped_time_out_of_a_units_seconds(tmp_path: Path) -> None:
    stops = tmp_path / "stops"
    stops.write_text("85.0 92.0\n95.0 96.0\n101.0 102.0\n", encoding="utf-8")
    script = flow.flow_script("tiny:span", "data.jsonl", 1, "key", "runs", stream=True)
    source = script[script.index("def unstopped") : script.index("def timed")]
    environ = types.SimpleNamespace(environ={"BENCH_STOPS": str(stops)})
    scope = {"os": environ, "time": types.SimpleNamespace(time=lambda: 100.0)}
    exec(source, scope)  # noqa: S102 - the flow script's own function, as the benchmark runs it
    # the unit ran from 90 to 100 by the wall clock: stopped 90-92 and 95-96, so 7 s of it trained
    assert scope["unstopped"](10.0) == pytest.approx(7.0)
    assert scope["unstopped"](3.0) == pytest.approx(3.0)  # 97-100: no stop
