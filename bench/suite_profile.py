"""Where the test command's CPU goes: a pytest plugin that records, per test, the CPU of every process it started.

    PYTHONPATH=bench SUITE_PROFILE=/tmp/suite.jsonl .venv/bin/python -m pytest -q -n 2 --dist loadfile -p suite_profile
    .venv/bin/python bench/suite_profile.py /tmp/suite.jsonl

Each pytest process (with xdist: each worker, and the controller) samples ``/proc`` every 0.2 s: its descendants
(children, grandchildren, and those reparented after their parent died), their CPU time (user + system), what each
is (a session worker spawned by multiprocessing, a flow child, a Prefect server, ...), and whether any thread of the
test's processes is runnable. Per test it writes one JSON line: wall seconds, the pytest process's own CPU, the
descendants' CPU by kind, the processes started by kind, and the idle seconds (no thread runnable: the test only
waited). The controller's line (``<controller>``) counts every process of the run once. A process that lives less
than a sample is missed, and the last 0.2 s of a killed one; the sampling itself costs the pytest process a few
percent of a core. On a busy host CPU seconds are the figure to compare: wall time follows the neighbours' load.

The summary (``python bench/suite_profile.py FILE``) prints per file: wall, CPU, idle and processes started, and the
CPU by kind over the run.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

TICK = os.sysconf("SC_CLK_TCK")
INTERVAL = 0.2
SPAWNED = "multiprocessing spawn child (session worker, scoring or ONNX child)"
KINDS = (  # (a word of the command line, the kind), first match wins
    ("exec(eval(sys.stdin.readline()))", "pytest-xdist worker (the tests' own code)"),
    ("spawn_main", SPAWNED),
    ("support.forkserver", "fork server and its children"),
    ("support.flow_child", "flow child"),
    ("support.session_child", "session child"),
    ("uvicorn", "Prefect server"),
    ("server start", "Prefect server"),
    ("prefect-gliner2", "CLI"),
    ("-m prefect", "Prefect CLI"),
    ("moto", "S3 server"),
    ("mlflow", "MLflow server"),
    ("while True: pass", "busy loop"),
    ("resource_tracker", "multiprocessing resource tracker"),
)


class Sampler:
    """This process's descendants' CPU, sampled, and charged to the test that runs meanwhile."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current = "<controller>" if "PYTEST_XDIST_WORKER" not in os.environ else "<between tests>"
        self.stats: dict[str, dict[str, Any]] = {}
        self.known: dict[int, tuple[float, str]] = {}  # pid -> (CPU seconds seen, kind)
        self.last: float | None = None

    def entry(self, test: str) -> dict[str, Any]:
        return self.stats.setdefault(
            test,
            {"wall": 0.0, "self": 0.0, "idle": 0.0, "cpu": collections.Counter(), "started": collections.Counter()},
        )

    def sample(self) -> None:
        me, table = os.getpid(), _process_table()
        family = {pid for pid in table if pid != me and (pid in self.known or _descends(pid, me, table, self.known))}
        busy = any(_runnable(pid) for pid in [*family, me])
        now = time.monotonic()
        with self.lock:
            stats = self.entry(self.current)
            if self.last is not None and not busy:
                stats["idle"] += now - self.last
            self.last = now
            for pid in family:
                seen, kind = self.known.get(pid) or (0.0, _kind(pid))
                if kind == SPAWNED:  # a forkserver names itself once its code runs: look again
                    kind = _kind(pid)
                if pid not in self.known:
                    stats["started"][kind] += 1
                stats["cpu"][kind] += max(0.0, table[pid][1] - seen)
                self.known[pid] = (table[pid][1], kind)
            for pid in [pid for pid in self.known if pid not in table]:
                del self.known[pid]

    def loop(self) -> None:
        while True:
            try:
                self.sample()
            except OSError:
                pass
            time.sleep(INTERVAL)


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return table


def _descends(pid: int, root: int, table: dict[int, tuple[int, float]], known: dict[int, Any]) -> bool:
    parent, hops = table[pid][0], 0
    while parent and hops < 32:
        if parent == root or parent in known:
            return True
        parent, hops = table.get(parent, (0, 0.0))[0], hops + 1
    return False


def _runnable(pid: int) -> bool:
    """Whether a thread of `pid` other than the sampler's is running, runnable or in uninterruptible I/O."""
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            if int(task) == threading.get_native_id():
                continue
            if Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(") ", 1)[1][0] in "RD":
                return True
    except (OSError, IndexError):
        pass
    return False


#: (the name in /proc/PID/comm, the kind): the worker forkserver and the workers it forks share the spawn command line
COMMS = (("gliner2-forksrv", "session worker forkserver"), ("gliner2-worker", "session worker (forked)"))


def _kind(pid: int) -> str:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    if named := next((kind for name, kind in COMMS if name == comm), None):
        return named
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    return next((kind for word, kind in KINDS if word in command), "other: " + " ".join(command.split()[1:3])[:40])


_SAMPLER = Sampler()


def pytest_configure(config: pytest.Config) -> None:
    threading.Thread(target=_SAMPLER.loop, name="suite-profile", daemon=True).start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _SAMPLER.sample()
    with _SAMPLER.lock:
        _SAMPLER.current = item.nodeid
    started, own = time.monotonic(), time.process_time()
    try:
        return (yield)
    finally:
        _SAMPLER.sample()
        with _SAMPLER.lock:
            stats = _SAMPLER.entry(item.nodeid)
            stats["wall"] += time.monotonic() - started
            stats["self"] += time.process_time() - own
            _SAMPLER.current = "<between tests>"


def pytest_unconfigure(config: pytest.Config) -> None:
    _SAMPLER.sample()
    out = os.environ.get("SUITE_PROFILE", "suite-profile.jsonl")
    with _SAMPLER.lock, open(out, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps({"test": test, **stats}) + "\n" for test, stats in _SAMPLER.stats.items()))


def summary(path: Path) -> str:
    """Per file: wall, CPU (own + descendants), idle and processes started; the CPU by kind over the run."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    files: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    kinds: dict[str, float] = collections.defaultdict(float)
    for row in rows:
        if row["test"].startswith("<"):  # the controller's line (its whole family), or time between tests
            for kind, seconds in row["cpu"].items() if row["test"] == "<controller>" else ():
                kinds[kind] += seconds
            continue
        for key, value in (
            ("wall", row["wall"]),
            ("idle", row["idle"]),
            ("cpu", row["self"] + sum(row["cpu"].values())),
            ("started", sum(row["started"].values())),
        ):
            files[row["test"].split("::")[0]][key] += value
            files["all files"][key] += value
    lines = [f"{'file':48} {'wall s':>7} {'CPU s':>7} {'idle s':>7} {'processes':>9}"]
    for name, file in sorted(files.items(), key=lambda item: -item[1]["cpu"]):
        lines.append(f"{name:48} {file['wall']:7.0f} {file['cpu']:7.0f} {file['idle']:7.0f} {file['started']:9.0f}")
    lines.append("CPU of the run's processes by kind (the controller's view):")
    lines += [f"  {seconds:7.0f} s  {kind}" for kind, seconds in sorted(kinds.items(), key=lambda item: -item[1])]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
