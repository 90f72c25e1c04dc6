"""The path of ``prefect-gliner2 train`` from the command to its worker, traced: which product functions run in the
command's process (main thread) from the CLI's ``run`` until the worker is sent its run (``SessionWorker._spawn``).

    python bench/run_path.py

Runs the command in this process against a throwaway local Prefect server (tiny:span, the tests' tiny inputs) under
``sys.setprofile`` and prints: the product calls and distinct functions and files entered; how often
``runtime/rundir.py`` is entered from outside it; the manifest decodes (``load_manifest``), plan builds
(``ManagedTrainingPlan.__init__``) and manifest encodes in this process; and the stops: the functions entered from
the path's own modules (the CLI's train command, the flow, runtime.prepare, runtime.run) or entering them, module
bodies left out, in order of first entry. The worker decodes the manifest once more, in its own process.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

PROJECT = f"{ROOT}/"
PATH_MODULES = ("flows/cli/train.py", "flows/train.py", "runtime/prepare.py", "runtime/run.py")
Call = tuple[str, str, "str | None"]  # (file, function, the calling product file)


def _ours(path: str) -> bool:
    return path.startswith(PROJECT) and "/.venv/" not in path and "/tests/" not in path and "/bench/" not in path


def trace(argv: list[str]) -> list[Call]:
    from prefect_gliner2.flows.cli import main

    calls: list[Call] = []
    state = {"active": False, "done": False}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or state["done"] or not _ours(frame.f_code.co_filename):
            return
        where, name = frame.f_code.co_filename[len(PROJECT) :], frame.f_code.co_qualname
        state["active"] = state["active"] or (where == "flows/cli/train.py" and name == "run")
        if not state["active"]:
            return
        state["done"] = where == "runtime/worker.py" and name == "SessionWorker._spawn"
        caller = frame.f_back
        while caller is not None and not _ours(caller.f_code.co_filename):
            caller = caller.f_back
        calls.append((where, name, caller.f_code.co_filename[len(PROJECT) :] if caller is not None else None))

    sys.setprofile(profile)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    if status != 0:
        raise SystemExit(f"prefect-gliner2 train exited with {status}")
    return calls


def report(calls: list[Call]) -> list[str]:
    rundir = [(name, caller) for where, name, caller in calls if where == "runtime/rundir.py" and caller != where]
    stops = [
        (where, name)
        for where, name, caller in calls
        if name != "<module>"
        and ((caller in PATH_MODULES and where != caller) or (where in PATH_MODULES and caller not in PATH_MODULES))
    ]
    first = list(dict.fromkeys(stops))
    count = collections.Counter(name for _, name, _ in calls)
    lines = [
        f"product calls {len(calls)}, distinct functions {len({c[:2] for c in calls})}, "
        f"files {len({c[0] for c in calls})}",
        f"runtime/rundir.py entered {len(rundir)} times from outside it",
        f"manifest decodes {count['load_manifest']}, plan builds {count['ManagedTrainingPlan.__init__']}, "
        f"manifest encodes {count['encode_manifest']} (this process)",
        f"stops {len(stops)} ({len(first)} distinct, in {len({where for where, _ in first})} files):",
    ]
    return lines + [f"  {where} {name}" for where, name in first]


def main() -> None:
    from support.config import training_config
    from support.flow import make_inputs
    from support.prefect_harness import local_prefect_server

    with tempfile.TemporaryDirectory(prefix="run-path-") as tmp:
        files = make_inputs(Path(tmp) / "data")
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(training_config()))
        argv = ["train", "--model", "tiny:span", "--train", files["train"], "--valid", files["valid"]]
        argv += ["--config", str(config), "--run-key", "path", "--storage", f"{tmp}/runs", "--cpu-threads", "1"]
        with local_prefect_server():
            calls = trace(argv)
    print("\n".join(report(calls)))


if __name__ == "__main__":
    main()
