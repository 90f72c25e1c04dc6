"""The flow process's side of a resume, alone in this process: its peak RSS, for `bench/realsize.py`.

    python bench/flow_side_resume.py STORAGE RUN_KEY

Imports what a flow process imports (`flows.train`: Prefect and the runtime), then does what opening a run does
before it starts the worker on a resume (`runtime.run.recover_run_directory`: debris removal, the index-only damage
check of the checkpoint the durable cursor names), and the cursor read. Prints one JSON line: the peak RSS
(`VmHWM`) in MB, the part of it added after the imports, and the seconds of the resume steps. Refuses to report when
torch was imported (the flow process must not be).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import prefect_gliner2.flows.train  # noqa: E402, F401  (what the flow process holds)
from prefect_gliner2.runtime.run import recover_run_directory  # noqa: E402
from prefect_gliner2.runtime.rundir import RunDirectory  # noqa: E402


def vm_kib(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def main(storage: str, run_key: str) -> None:
    imported = vm_kib("VmHWM")
    started = time.perf_counter()
    run_dir = RunDirectory(storage, run_key)
    if recover_run_directory(run_dir, lambda position: 0) is not None:
        raise SystemExit("the checkpoint the cursor names failed the index check")
    if run_dir.newest_checkpoint_uri() is None:
        raise SystemExit("no durable cursor in the run directory")
    seconds = time.perf_counter() - started
    if "torch" in sys.modules:
        raise SystemExit("the flow side imported torch")
    peak = vm_kib("VmHWM")
    figures = {"flow_rss_mb": peak / 1024, "flow_resume_extra_mb": (peak - imported) / 1024, "flow_side_s": seconds}
    print(json.dumps(figures))


if __name__ == "__main__":
    main(*sys.argv[1:3])
