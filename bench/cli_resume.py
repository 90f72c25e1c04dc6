"""`prefect-gliner2 train` run again after a crash, at the gliner2-base shape: time to the first batch, beside a
fresh start of the same command.

    python bench/cli_resume.py [--arch span,boundary] [--repeats 3] [--json OUT]

What a user waits for after a crash: the same command again, from its launch to its first batch trained. Each run
is the whole command (its own local Prefect server, no PREFECT_API_URL) in one PREFECT_HOME whose database the
reference run creates, on a model of the gliner2-base shape built offline (`GLINER2_BASE_SIZE`, as
`bench/realsize.py`). The reference run trains 4 batches with a checkpoint after each (2.5 GB each for span); its
run directory is then rewound to the state a kill right after its first checkpoint leaves (the cursor names that
checkpoint, the later ones and the export never happened) and kept aside. Then, taking turns, `--repeats` times:

- fresh: the command on a new run key (nothing to restore);
- resume: the command on a copy of the rewound run directory (copied, then synced: its checkpoint is in the page
  cache, as one written shortly before a crash is);
- resume-cold: the same with the copy's pages dropped from the page cache (as after a reboot, or a checkpoint
  written long before; the model's files stay cached in every variant).

Times are from the command's launch to the end of its first training task (its "Finished" log line; a resume's is
the batch after the checkpoint); each run is then killed with its process group, and the next starts once every
process of it is gone. Prints each variant's median (min-max), the ratios to the fresh start of the same turn
(target <= 1.2), and the restoring worker's start as the run's log tells it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fresh_process import uncache  # noqa: E402  (bench/fresh_process.py, beside this script)
from realsize_flow import rewind_to_first_checkpoint  # noqa: E402

CLI = str(Path(sys.executable).with_name("prefect-gliner2"))
FIRST_TASK = re.compile(r"Task run 'batches \d+-\d+[^']*' - Finished")
RESTORED = re.compile(r"session worker \(pid \d+\) restored \S+; its start, [^:]*: (.*)")
CONFIG = {"num_epochs": 1, "batch_size": 2, "eval_strategy": "no", "fp16": False, "bf16": False, "seed": 11}
VARIANTS = ("fresh", "resume", "resume-cold")


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of every command here: its own local Prefect server in one PREFECT_HOME, offline."""
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp / "home"),
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        **extra,
    )
    return env


def one_run(tmp: Path, tag: str, argv: list[str]) -> dict[str, Any]:
    """The CLI with `argv` until its first training task finished (then killed): seconds from its launch."""
    env = cli_env(tmp, BENCH_CLI_RESUME_RUN=tag)  # every process of the run inherits the tag: how its end is found
    command = [CLI, *argv]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    first, restored, lines = None, None, []
    assert process.stdout is not None
    try:
        for line in process.stdout:
            lines.append(line)
            found = RESTORED.search(line)
            if found:
                restored = found.group(1)
            if FIRST_TASK.search(line):
                first = time.perf_counter() - started
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
        _wait_gone(tag)
    if first is None:
        raise SystemExit(f"run {tag} ended before its first batch ({process.returncode}):\n{''.join(lines[-40:])}")
    return {"first": first, "restored": restored}


def _wait_gone(tag: str, timeout: float = 60.0) -> None:
    """Until no process carries the run's tag (its worker left the process group, and dies with its parent)."""
    needle = f"BENCH_CLI_RESUME_RUN={tag}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        alive.append(pid)
            except OSError:
                continue
        if not alive:
            return
        time.sleep(0.2)
    raise SystemExit(f"processes of run {tag} still alive after {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="span", help="span, boundary or both (span,boundary)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", choices=("base", "tiny"), default="base", help="tiny: a smoke test of the script")
    parser.add_argument("--json", help="also write the measurements (a list, one per arch) as JSON to this file")
    args = parser.parse_args()
    results = [measure(arch, args) for arch in args.arch.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}; seconds from the launch to the first batch, median (min-max)")
    for result in results:
        print(
            f"prefect-gliner2 train at the {'gliner2-base' if args.size == 'base' else 'tiny'} shape "
            f"({result['arch']}), resumed from batch {result['position']} (a {result['checkpoint_bytes'] / 1e9:.2f} "
            f"GB checkpoint) vs a fresh start, {args.repeats} turns"
        )
        fresh = [run["first"] for run in result["times"]["fresh"]]
        for variant in VARIANTS:
            values = [run["first"] for run in result["times"][variant]]
            line = f"  {variant:11} {statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"
            if variant != "fresh":
                ratios = [value / base for value, base in zip(values, fresh, strict=True)]
                result[f"{variant}_ratio"] = ratios
                line += f"  vs fresh {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}); "
                line += "target <= 1.2"
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def measure(arch: str, args: argparse.Namespace) -> dict[str, Any]:
    """One architecture: the reference run, its rewound copy, then `args.repeats` turns of the variants."""
    from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records

    with tempfile.TemporaryDirectory(prefix="cli-resume-", dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        shape = dict(GLINER2_BASE_SIZE) if args.size == "base" else {}
        model = save_tiny_model(tmp / "model", arch, seed=0, dropout=0.1, **shape)
        data = tmp / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(8, seed=5)), encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")

        def argv(key: str, storage: Path) -> list[str]:
            return ["train", "--model", str(model), "--train", str(data), "--config", str(tmp / "config.json"),
                    "--run-key", key, "--storage", str(storage), "--checkpoint-every", "1"]  # fmt: skip

        reference = subprocess.run(
            [CLI, *argv("resumed", tmp / "reference")],
            env=cli_env(tmp),
            capture_output=True,
            text=True,
            check=False,
        )
        if reference.returncode != 0:
            raise SystemExit(f"the reference run failed:\n{reference.stderr[-4000:]}")
        position, size = rewind_to_first_checkpoint(tmp / "reference" / "resumed")
        times: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
        for repeat in range(args.repeats):
            turn = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
            for variant in turn:
                storage = tmp / f"runs-{variant}-{repeat}"
                if variant == "fresh":
                    run_argv = argv(f"fresh-{repeat}", storage)
                else:
                    shutil.copytree(tmp / "reference" / "resumed", storage / "resumed")
                    os.sync()
                    if "cold" in variant:
                        uncache(storage / "resumed")
                    run_argv = argv("resumed", storage)
                times[variant].append(one_run(tmp, f"{arch}-{variant}-{repeat}", run_argv))
                shutil.rmtree(storage, ignore_errors=True)
                measured = times[variant][-1]
                print(
                    f"  {arch:8} {variant:11} turn {repeat + 1}: first batch {measured['first']:.2f} s"
                    + (f"; the restoring worker's start: {measured['restored']}" if measured["restored"] else ""),
                    flush=True,
                )
    return {"arch": arch, "position": position, "checkpoint_bytes": size, "times": times}


if __name__ == "__main__":
    main()
