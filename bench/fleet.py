"""Fleet benchmark, side by side in one run: a sweep of 4 runs on 2 worker slots vs one slot (the same 4 runs one
after another), resume after SIGKILL on object storage (a moto S3 server on loopback) vs local disk, and bytes kept
per run with checkpoint retention on vs off.

    .venv/bin/python bench/fleet.py            # prints a markdown table of ratios (about 5-10 minutes on 2 cores)

Training runs use the tiny span model with one CPU thread each. The sweep's workers are the served deployments
(``python -m prefect_gliner2.deployments.serve --limit N``): each run is its own process, as on a process worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

CONFIG = {
    "fp16": False,
    "bf16": False,
    "batch_size": 2,
    "gradient_accumulation_steps": 1,
    "num_epochs": 3,
    "eval_strategy": "epoch",
    "seed": 11,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _inputs(root: Path) -> dict[str, str]:
    from prefect_gliner2.training.tiny import tiny_records

    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, count, seed in (("train", 24, 5), ("valid", 6, 99)):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(count, seed=seed)))
        paths[name] = str(path)
    return paths


def _flow_params(inputs: dict[str, str], storage: str, run_key: str, keep: int | None = 3) -> dict[str, Any]:
    return {
        "model": "tiny:span",
        "train_data": inputs["train"],
        "valid_data": inputs["valid"],
        "config": CONFIG,
        "run_key": run_key,
        "storage": storage,
        "checkpointing": {"checkpoint_every": 1, "keep_checkpoints": keep},
        "execution": {"cpu_threads": 1},
    }


def _child(params: dict[str, Any], api: str, env: dict[str, str] | None = None, plan: str = "") -> tuple[int, float]:
    """train_flow in a fresh interpreter (tests/support/flow_child.py), with a FaultPlan's JSON installed first."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "support.flow_child", json.dumps(params), plan],
        cwd=str(ROOT),
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
            "PREFECT_API_URL": api,
            **(env or {}),
        },
        capture_output=True,
        text=True,
    )
    return done.returncode, time.perf_counter() - started


def retention(inputs: dict[str, str], root: Path) -> list[tuple[str, str, str]]:
    from prefect_gliner2.flows.train import train_flow

    kept = {}
    for keep in (3, None):
        summary = train_flow(**_flow_params(inputs, str(root / "retention"), f"keep-{keep}", keep=keep))
        kept[keep] = summary
    on, off = kept[3], kept[None]
    return [
        (
            "bytes kept per run, retention keep_checkpoints=3 vs off",
            f"{on['disk_bytes'] / off['disk_bytes']:.2f}",
            f"{on['disk_bytes'] / 2**20:.1f} MiB ({on['checkpoints_kept']} checkpoints) vs "
            f"{off['disk_bytes'] / 2**20:.1f} MiB ({off['checkpoints_kept']} checkpoints)",
        )
    ]


def resume_latency(inputs: dict[str, str], root: Path, api: str) -> list[tuple[str, str, str]]:
    from prefect_gliner2.runtime.faults import Fault, FaultPlan

    port = _free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    s3_env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT")).close()
        times = {}
        for name, storage in (("local", str(root / "resume")), ("s3", "s3://bench/runs")):
            params = _flow_params(inputs, storage, f"full-{name}")
            code, full = _child(params, api, s3_env)
            assert code == 0, f"{name}: the uninterrupted run failed ({code})"
            killed = dict(params, run_key=f"killed-{name}")
            die = FaultPlan((Fault.kill("cursor", 20, once=str(root / f"died-{name}")),)).to_json()
            code, _ = _child(killed, api, s3_env, die)  # the flow process SIGKILLs itself at batch 20 (worker too)
            assert code == -signal.SIGKILL, f"{name}: the run was not killed ({code})"
            code, resumed = _child(killed, api, s3_env)  # a new flow run with the same run key resumes it
            assert code == 0, f"{name}: the resumed run failed ({code})"
            times[name] = (resumed, full)
    finally:
        moto.terminate()
        moto.wait(10)
    (s3_resumed, s3_full), (local_resumed, local_full) = times["s3"], times["local"]
    return [
        (
            "resume after SIGKILL (new flow run to the end), S3 (moto, loopback) vs local",
            f"{s3_resumed / local_resumed:.2f}",
            f"{s3_resumed:.2f} s vs {local_resumed:.2f} s (uninterrupted runs: {s3_full:.2f} s vs {local_full:.2f} s)",
        )
    ]


def sweep(inputs: dict[str, str], root: Path, api: str) -> list[tuple[str, str, str]]:
    from prefect_gliner2.flows.sweep import sweep_flow

    walls = {}
    for slots in (2, 1):
        serve = subprocess.Popen(
            [sys.executable, "-m", "prefect_gliner2.deployments.serve", "--limit", str(slots)],
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            time.sleep(20)  # the runner registers the deployments and starts polling
            base = _flow_params(inputs, str(root / f"sweep-{slots}"), "unused")
            base.pop("run_key")
            started = time.perf_counter()
            board = sweep_flow(
                base=base,
                points=[{"seed": s} for s in (1, 2, 3, 4)],
                sweep_key=f"bench-{slots}",
                max_parallel=slots,
                poll_seconds=0.5,
            )
            walls[slots] = time.perf_counter() - started
            assert not board["failed"], board
        finally:
            os.killpg(serve.pid, signal.SIGINT)
            serve.wait(60)
    return [
        (
            "sweep of 4 runs: 2 worker slots vs the same 4 runs one after another (1 slot)",
            f"{walls[2] / walls[1]:.2f}",
            f"{walls[2]:.1f} s vs {walls[1]:.1f} s on {os.cpu_count()} CPU(s), 1 thread per run",
        )
    ]


def main() -> None:
    import prefect.settings as settings
    from prefect.settings import temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    inputs = _inputs(root / "data")
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        api = str(settings.PREFECT_API_URL.value())
        rows = retention(inputs, root) + resume_latency(inputs, root, api) + sweep(inputs, root, api)
    print("| measurement | ratio | detail |\n|---|---:|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} |")


if __name__ == "__main__":
    main()
