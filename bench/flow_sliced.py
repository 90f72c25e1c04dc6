"""The flow's cost per batch against gliner2's own ``train()``, measured in alternating time slices so that what the
machine's neighbours do in the meantime falls on both alike: the resolution ``bench/flow.py`` cannot reach by
separate runs on a shared host.

    python bench/flow_sliced.py                        # tiny (~15 ms), ~100 ms and ~1 s steps, 240 s each (~27 min)
    python bench/flow_sliced.py --cases tiny --seconds 300 --slice 2 --json out.json
    python bench/flow_sliced.py --quick                # a short run: checks the script
    python bench/flow_sliced.py --cases 1s --native-memory worker   # native with the flow worker's malloc setting

Why: on this project's VMs a training step's speed moves by 10% and more within seconds and between minutes (the
host's other guests); separate runs of a minute each, native then flow, differ by that much, and their ratio's 95%
interval over three groups was +-0.23 (``bench/flow.py``). Here both run at once as processes but never at the same
moment: the native run (``bench/flow.py``'s script, the same plan, config, data, threads and model) and the training
flow (default settings, against a local Prefect server up during both) are started one after the other, each trains
past its start-up (the flow until its automatic task grain has grown), and then they take turns: one is stopped
(SIGSTOP to the process and its children: the flow process and its session worker) while the other runs for
``--slice`` seconds, native, flow, native, flow, ..., until each has had ``--seconds`` of running time (a
neighbour's burst or a drift of the host's speed falls on turns a few seconds apart, so on both alike). The Prefect
server is never stopped: it idles during the native slices and serves the flow during the flow's, as when they run
one after the other.

Each run prints a mark as it happens (native: every optimizer step; flow: every training task's result reaching the
flow, with the plan cursor). A side's cost per batch is its running time (the slices it ran) over the batches its
marks advanced in that time, the cursor interpolated linearly in running time between marks, both sides over the
same wall-clock windows (from one of the flow's marks to another). Printed per case: the ratio of the two over the
whole window and per block (the windows between the flow's marks, at least ``--block`` seconds of the flow's running
time each), with the blocks' median, spread and the 95% t-interval of their mean (the resolution achieved), the two
sides' ms per batch, and the flow's task sizes during the window.

What the slicing would change, and what is done about it: the automatic task grain and checkpoint cadence time the
worker by the wall clock, so a stop inside a task would make it look slower and the grain would form smaller tasks
than unstopped (more Prefect task runs per batch: at 2 s slices about half the size, tasks of 2.4 s instead of 5).
The controller writes each stop of the flow (its start and end) to a file before continuing it, and the flow's
script takes the stopped time out of each task's seconds before the grain sees them (``unstopped`` in
``bench/flow.py``'s flow script), so the grain and the cadence measure what they would unstopped. What still sees
the wall clock (the reporter's rate limits: the progress shown at most every few seconds) updates more often per
batch than unstopped, which only adds to the flow's cost. The task sizes the flow ran are printed. Fixed costs
(start-up, first batch, exit) are not measured here: ``bench/flow.py`` measures them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flow  # noqa: E402  (bench/flow.py: the compared scripts, cases, config and calibration)

ROOT = flow.ROOT
NATIVE_WARMUP_S = 3.0  # native training before its first stop (past its first steps)
FLOW_WARMUP_S = 20.0  # the flow's training before its first stop: the automatic grain grows x4 per task to ~5 s


class Timeline:
    """One side's marks and the intervals it ran during the alternation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.marks: list[tuple[float, int]] = []  # (the run's clock, batches done / plan cursor)
        self.slices: list[tuple[float, float]] = []  # running intervals during the alternation, in order
        self._before: list[float] = []
        self._lock = threading.Lock()

    def running(self, moment: float) -> float:
        """Running time of the alternation up to `moment` (seconds of its slices before it)."""
        if len(self._before) != len(self.slices):  # the running time before each slice, cumulated once
            self._before = [0.0]
            for start, end in self.slices[:-1]:
                self._before.append(self._before[-1] + end - start)
        i = bisect_right(self.slices, (moment, float("inf"))) - 1
        if i < 0:
            return 0.0
        start, end = self.slices[i]
        return self._before[i] + min(end, moment) - start

    def curve(self) -> tuple[list[float], list[int]]:
        """(running time, count) at each mark inside the alternation window."""
        first, last = self.slices[0][0], self.slices[-1][1]
        with self._lock:
            marks = [(t, c) for t, c in self.marks if first <= t <= last]
        return [self.running(t) for t, _ in marks], [c for _, c in marks]


class Side(Timeline):
    """One run (native or flow) as a process tree that can be stopped and continued, its marks and running time."""

    def __init__(self, name: str, script: str, env: dict[str, str], stops: Path | None = None) -> None:
        import psutil

        super().__init__(name)
        self.stops, self.stopped_at = stops, None
        self.process = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.root = psutil.Process(self.process.pid)
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._errors = threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True)  # type: ignore[arg-type]
        self._errors.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("MARK "):
                _, stamp, count = line.split()
                with self._lock:
                    self.marks.append((float(stamp), int(count)))

    def first_mark(self) -> float | None:
        with self._lock:
            return self.marks[0][0] if self.marks else None

    def _tree(self) -> list[Any]:
        import psutil

        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def signal(self, number: int) -> None:
        import psutil

        for process in self._tree():
            try:
                process.send_signal(number)
            except psutil.Error:
                pass

    def stop(self) -> None:
        self.stopped_at = time.time()
        self.signal(signal.SIGSTOP)

    def run_for(self, seconds: float) -> None:
        """Continue the run for `seconds` of wall time, then stop it; the interval is recorded."""
        started = time.time()
        if self.stops is not None and self.stopped_at is not None:
            with self.stops.open("a", encoding="utf-8") as handle:  # before it runs again: it reads them then
                handle.write(f"{self.stopped_at!r} {started!r}\n")
        self.signal(signal.SIGCONT)
        time.sleep(seconds)
        self.stop()
        self.slices.append((started, self.stopped_at))
        if self.process.poll() is not None:
            raise SystemExit(
                f"the {self.name} run ended during the alternation: make its plan longer\n"
                + "".join(self.stderr)[-4000:]
            )

    def kill(self) -> None:
        tree = self._tree()
        for process in tree:
            try:
                process.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.signal(signal.SIGCONT)
        self.process.wait(timeout=60)
        self._errors.join(timeout=10)


def count_at(xs: list[float], ys: list[int], x: float) -> float | None:
    """The count at running time `x`, linear between the marks around it (None outside the marks)."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    i = bisect_right(xs, x)
    if i >= len(xs):
        return float(ys[-1])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0) if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def per_batch(side: Timeline, lo: float, hi: float) -> float | None:
    """Seconds of running time per batch between running times `lo` and `hi` (None: no marks around both)."""
    xs, ys = side.curve()
    a, b = count_at(xs, ys, lo), count_at(xs, ys, hi)
    if a is None or b is None or b <= a:
        return None
    return (hi - lo) / (b - a)


def per_batch_between(side: Timeline, lo: float, hi: float) -> float | None:
    """Seconds of running time per batch between wall-clock moments `lo` and `hi` of the alternation."""
    return per_batch(side, side.running(lo), side.running(hi))


def alternate(native: Side, flowside: Side, seconds: float, slice_s: float) -> None:
    """Take turns native, flow, native, ... of `slice_s` each, `seconds` of running time each."""
    for _ in range(max(1, round(seconds / slice_s))):
        native.run_for(slice_s)
        flowside.run_for(slice_s)


def wait_for_training(side: Side, after_first_s: float, limit_s: float = 600.0) -> None:
    deadline = time.time() + limit_s
    while side.first_mark() is None:
        if side.process.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the {side.name} run did not start training:\n" + "".join(side.stderr)[-4000:])
        time.sleep(0.05)
    time.sleep(after_first_s)


def bench_case(case: dict[str, Any], args: argparse.Namespace, threads: int, work: Path) -> dict[str, Any]:
    import psutil

    from support.prefect_harness import local_prefect_server

    step = flow.step_seconds(case["model"], threads, work)
    # both train through their warm-up and their share of the alternation; twice that, so neither plan ends first
    length = max(64, int(2 * (args.seconds + FLOW_WARMUP_S + NATIVE_WARMUP_S) / step))
    data = flow.write_data(work / f"train-{length}.jsonl", length)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **flow.ENV)
    with local_prefect_server() as api:
        server = ",".join(str(p.pid) for p in psutil.Process().children(recursive=True))
        out = tempfile.mkdtemp(prefix="native-", dir=work)
        memory = {}
        if args.native_memory == "worker":  # the allocator taken out of the comparison, as bench/flow.py's "retaining"
            from prefect_gliner2.runtime.spawn import worker_environment

            memory = worker_environment({})
        native_env = dict(env, **memory)
        native = Side("native", flow.native_script(case["model"], data, threads, out, stream=True), native_env)
        flowside = None
        try:
            wait_for_training(native, NATIVE_WARMUP_S)
            native.stop()
            key = f"sliced-{case['model'].replace(':', '-')}-{length}"
            script = flow.flow_script(case["model"], data, threads, key, str(work / "runs"), stream=True)
            stops = work / f"{key}.stops"
            stops.write_text("", encoding="utf-8")
            flow_env = dict(env, PREFECT_API_URL=api, BENCH_SERVER_PIDS=server, BENCH_STOPS=str(stops))
            flowside = Side("flow", script, flow_env, stops)
            wait_for_training(flowside, args.flow_warmup)
            flowside.stop()
            alternate(native, flowside, args.seconds, args.slice)
        finally:
            native.kill()
            if flowside is not None:
                flowside.kill()
            if args.logs:  # each side's stderr (the flow's: Prefect's log lines), to look into a slow block
                logs = Path(args.logs)
                logs.mkdir(parents=True, exist_ok=True)
                for side in (native, flowside):
                    if side is not None:
                        name = f"{case['model'].replace(':', '-')}-{side.name}.log"
                        (logs / name).write_text("".join(side.stderr), encoding="utf-8")
    figures = measure(native, flowside, args.block)
    return {
        "case": case["name"],
        "model": case["model"],
        "step_s": step,
        "slice_s": args.slice,
        "block_s": args.block,
        "seconds": args.seconds,
        "native_memory": args.native_memory,
        **figures,
        "interval": flow.interval(figures["block_ratios"]) if figures["block_ratios"] else "",
        "block_mean": statistics.fmean(figures["block_ratios"]) if figures["block_ratios"] else None,
        "block_half_width": flow.half_width(figures["block_ratios"]),
        "raw": {  # every mark and running interval of both sides (for analyses this script does not print)
            side.name: {"marks": side.marks, "slices": side.slices} for side in (native, flowside)
        },
        "native_running": native.running(float("inf")),
        "flow_running": flowside.running(float("inf")),
    }


def measure(native: Timeline, flowside: Timeline, block: float) -> dict[str, Any]:
    """Both sides' running seconds per batch over the whole window and per block; the flow's tasks (batches, running
    seconds). Blocks lie between the flow's own marks (exact counts there), at least `block` seconds of the flow's
    running time each; the native side is counted over the same wall-clock windows (its marks come every step, so
    its interpolation is close)."""
    # the flow's marks inside the alternation and inside the native's first and last marks there (a count is known
    # only between marks: past the native's last one its cursor is not)
    with native._lock:
        inside = [t for t, _ in native.marks if native.slices[0][0] <= t <= native.slices[-1][1]]
    lo, hi = max(flowside.slices[0][0], inside[0]), min(flowside.slices[-1][1], inside[-1])
    stamps = [t for t, _ in flowside.marks if lo <= t <= hi]
    blocks, begin = [], 0
    for end in range(1, len(stamps)):
        lo, hi = stamps[begin], stamps[end]
        if flowside.running(hi) - flowside.running(lo) < block:
            continue
        n, f = per_batch_between(native, lo, hi), per_batch_between(flowside, lo, hi)
        if n and f:
            blocks.append({"native": n, "flow": f, "ratio": f / n})
        begin = end
    # the whole window: from the flow's first mark to its last, both sides over the same wall-clock window
    total_n, total_f = (
        per_batch_between(side, stamps[0], stamps[-1]) if len(stamps) > 1 else None for side in (native, flowside)
    )
    if not total_n or not total_f:
        raise SystemExit("no batches between the marks of the alternation: make --seconds longer")
    xs, ys = flowside.curve()
    units = [(ys[i] - ys[i - 1], xs[i] - xs[i - 1]) for i in range(1, len(ys)) if ys[i] > ys[i - 1]]
    return {
        "native_s": total_n,
        "flow_s": total_f,
        "ratio": total_f / total_n,
        "blocks": blocks,
        "block_ratios": [b["ratio"] for b in blocks],
        "flow_units": units,
    }


def report(result: dict[str, Any]) -> list[str]:
    ratios, overall = result["block_ratios"], result["ratio"]
    lines = [
        f"{result['case']} ({result['model']}, native step {result['step_s'] * 1000:.0f} ms when calibrated"
        f"{', native with the worker memory setting' if result.get('native_memory') == 'worker' else ''}), "
        f"slices of {result['slice_s']:g} s, {result['native_running']:.0f} / {result['flow_running']:.0f} s "
        "running (native / flow):",
        f"  per batch, flow/native, whole window  {overall:.3f}   "
        f"({result['native_s'] * 1e3:.2f} vs {result['flow_s'] * 1e3:.2f} ms; target <= {flow.RATIO_TARGET}: "
        f"{'met' if overall <= flow.RATIO_TARGET else 'NOT met'})",
    ]
    if ratios:
        lines.append(
            f"  per block (>= {result['block_s']:g} s running each)   "
            f"{flow.spread(ratios, '.3f'):>24}   {result['interval']} over {len(ratios)} blocks"
        )
    if result["flow_units"]:
        sizes = [u[0] for u in result["flow_units"]]
        secs = [u[1] for u in result["flow_units"]]
        lines.append(
            f"  flow tasks in the window: {len(sizes)}, {flow.spread(sizes, '.0f')} batches, "
            f"{flow.spread(secs, '.2f')} s running each (the automatic grain aims at 5 s)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 s each side, tiny only (checks the script)")
    parser.add_argument("--cases", default=",".join(flow.CASES), help=f"comma-separated, of {', '.join(flow.CASES)}")
    parser.add_argument("--seconds", type=float, default=240.0, help="running time of each side in the alternation")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds each side runs at a turn")
    parser.add_argument("--block", type=float, default=15.0, help="running seconds per side in each reported block")
    parser.add_argument("--flow-warmup", type=float, default=FLOW_WARMUP_S, help="flow training before the first stop")
    parser.add_argument("--threads", type=int, help="torch threads of both (default: the flow's default)")
    parser.add_argument(
        "--native-memory",
        choices=("default", "worker"),
        default="default",
        help="the native run's malloc: glibc's default (as users start it) or the flow worker's setting",
    )
    parser.add_argument("--logs", help="write each side's stderr (the flow's log) to this folder, per case")
    parser.add_argument("--json", help="also write the figures and the raw marks and slices as JSON to this file")
    parser.add_argument("--device", help="cpu or cuda for the flow's worker (native gliner2 uses CUDA when present)")
    parser.add_argument("--bf16", action="store_true", help="bf16 in both (CUDA with native bf16 only)")
    args = parser.parse_args()
    flow.DEVICE = args.device
    flow.CONFIG["bf16"] = bool(args.bf16)
    if args.quick:
        args.cases, args.seconds, args.block, args.flow_warmup = "tiny", 30.0, 10.0, 10.0
    from prefect_gliner2.runtime.resources import default_cpu_threads

    threads = args.threads or default_cpu_threads()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-sliced-", dir=os.environ.get("BENCH_TMP")) as tmp:
        for name in args.cases.split(","):
            result = bench_case(flow.CASES[name], args, threads, Path(tmp))
            results.append(result)
            print("\n".join(report(result)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
