"""`prefect-gliner2 train` from the terminal, with and without the spare worker: time to the first batch, and to exit.

    python bench/cli_start.py [--model tiny:span:768x6] [--batches 12] [--repeat 3]

Each run is the whole command a user types (its own local Prefect server, no PREFECT_API_URL), on a new run key,
in one PREFECT_HOME whose database a first, unmeasured run creates. The two settings take turns
(`PREFECT_GLINER2_SPARE_WORKER=on`, the default: a worker process starts importing torch and gliner2 at once;
`off`: the worker is spawned when the flow run opens its run). Times are from the command's launch: the first batch
is the end of the first training task (its "Finished" log line), the exit the process's. Prints each setting's
median (min-max) and the differences of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLI = str(Path(sys.executable).with_name("prefect-gliner2"))
CONFIG = {"num_epochs": 1, "batch_size": 2, "eval_strategy": "no", "fp16": False, "bf16": False}


def one_run(tmp: Path, name: str, model: str, data: Path, spare: str) -> dict[str, float]:
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp / "home"),
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_GLINER2_SPARE_WORKER=spare,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    command = [CLI, "train", "--model", model, "--train", str(data), "--config", str(tmp / "config.json")]
    command += ["--storage", str(tmp / f"runs-{name}")]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    first = None
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if first is None and "Task run 'batches 0-" in line and "Finished" in line:
            first = time.perf_counter() - started
    code = process.wait()
    ended = time.perf_counter() - started
    if code != 0 or first is None:
        raise SystemExit(f"run {name} failed ({code}):\n{''.join(lines[-40:])}")
    return {"first": first, "exit": ended}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:span:768x6")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from prefect_gliner2.training.tiny import tiny_records

    with tempfile.TemporaryDirectory(prefix="cli-start-", dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        data = tmp / "train.jsonl"
        records = tiny_records(args.batches * CONFIG["batch_size"], seed=1)
        data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
        one_run(tmp, "warm-up", args.model, data, "on")  # creates the local server's database
        times: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
        for repeat in range(args.repeat):
            for spare in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                times[spare].append(one_run(tmp, f"{spare}-{repeat}", args.model, data, spare))
                print(
                    f"  {spare:3} run {repeat + 1}: first batch {times[spare][-1]['first']:.2f} s, exit "
                    f"{times[spare][-1]['exit']:.2f} s",
                    flush=True,
                )
    print(
        f"prefect-gliner2 train --model {args.model}, {args.batches} batches, {args.repeat} runs per setting "
        f"(taking turns), load average {os.getloadavg()[0]:.2f}; seconds from launch, median (min-max)"
    )
    medians = {}
    for spare in ("on", "off"):
        for what in ("first", "exit"):
            values = [run[what] for run in times[spare]]
            medians[spare, what] = statistics.median(values)
            label = "first batch" if what == "first" else "exit"
            print(f"  spare {spare:3} {label:12} {medians[spare, what]:6.2f} ({min(values):.2f}-{max(values):.2f})")
    for what, label in (("first", "first batch"), ("exit", "exit")):
        print(f"  spare on saves {medians['off', what] - medians['on', what]:.2f} s to the {label}")


if __name__ == "__main__":
    main()
