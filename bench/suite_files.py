"""Where the test command's time goes, per file, and how xdist's file scheduling spends it on two processes.

    .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=0 --durations-min=0 > /tmp/suite.log
    .venv/bin/python bench/suite_files.py /tmp/suite.log

Reads every ``--durations=0`` line of the log (setup, call and teardown of each test), sums them per file, collects
the suite (``pytest --collect-only -q``, for each file's tests in order) and replays pytest-xdist's ``loadfile``
scheduling (3.x: a process takes the next whole file from the queue whenever it has at most 2 tests left) on two
processes with these durations, for three queue orders: the suite's (collection order: ``tests/conftest.py`` puts
the files of ``HEAVIEST_FIRST`` first and turns xdist's reordering off; what ``make test`` uses), xdist's own default
(files with the most tests first) and the longest files first by these durations. Printed: the per-file table, each
order's makespan (the replayed wall time, start-up and collection left out) and the idle time of the process that
finishes first, and the lower bound (half the test time, or the longest file). The replay is a model of the
scheduler with measured test times, so the orders are compared on the same times, not on two runs of a noisy host;
when an order is near the bound, only shorter tests shorten the suite. Where the time goes inside the tests (the CPU
of the processes each one starts): ``bench/suite_profile.py``.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/[^:\s]+)::(\S+)")


def durations(log: Path) -> dict[str, float]:
    """node id -> seconds (setup + call + teardown) from a --durations=0 log."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            seconds[f"{match[3]}::{match[4]}"] += float(match[1])
    return seconds


def collection() -> list[str]:
    """The suite's node ids in collection order, as `make test` selects them."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    ids = [line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    if not ids:
        raise SystemExit(f"pytest --collect-only found no tests (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return ids


def replay(files: list[tuple[str, list[float]]], processes: int = 2) -> tuple[float, float]:
    """xdist loadfile with `processes` workers over `files` (name, test seconds in order), in queue order:
    returns (makespan, idle seconds of the first process to finish before the last one does)."""
    queue = collections.deque(files)
    pending: list[collections.deque[float]] = [collections.deque() for _ in range(processes)]
    clock = [0.0] * processes

    def refill(worker: int) -> None:
        while queue and len(pending[worker]) <= 2:
            pending[worker].extend(queue.popleft()[1])

    for worker in range(processes):
        if queue:
            pending[worker].extend(queue.popleft()[1])
    for worker in range(processes):
        refill(worker)
    events = [(0.0, worker) for worker in range(processes)]
    heapq.heapify(events)
    finished = [0.0] * processes
    while events:
        now, worker = heapq.heappop(events)
        refill(worker)  # the test that ran until now is complete: xdist reschedules on each completion
        if not pending[worker]:
            finished[worker] = now
            continue
        clock[worker] = now + pending[worker].popleft()
        heapq.heappush(events, (clock[worker], worker))
    return max(finished), max(finished) - min(finished)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="output of a pytest run with --durations=0 --durations-min=0")
    args = parser.parse_args()
    seconds = durations(args.log)
    ids = collection()
    by_file: dict[str, list[float]] = {}
    for node in ids:
        by_file.setdefault(node.split("::", 1)[0], []).append(seconds.get(node, 0.0))
    unknown = len([node for node in ids if node not in seconds])
    total = sum(sum(times) for times in by_file.values())
    print(f"{len(ids)} tests in {len(by_file)} files, {total:.0f} s of test time ({unknown} with no duration line)")
    print(f"{'file':48} {'tests':>5} {'seconds':>8} {'share':>6}")
    for name, times in sorted(by_file.items(), key=lambda item: -sum(item[1]))[:25]:
        print(f"{name:48} {len(times):5d} {sum(times):8.1f} {sum(times) / total:6.1%}")
    longest_first = sorted(by_file.items(), key=lambda item: -sum(item[1]))
    # xdist's default: the files in pytest's own order (by name), then most tests first (a stable sort)
    default_order = sorted(by_file.items(), key=lambda item: (-len(item[1]), item[0]))
    for label, order in (
        ("the suite's order (collection order)", list(by_file.items())),
        ("xdist's default (most tests first)", default_order),
        ("the longest files first", longest_first),
    ):
        makespan, idle = replay(order)
        print(f"two processes, {label:36} {makespan:7.1f} s, the first to finish idles {idle:6.1f} s")
    bound = max(total / 2, max(map(sum, by_file.values())))
    print(f"lower bound (half the test time, or the longest file): {bound:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
