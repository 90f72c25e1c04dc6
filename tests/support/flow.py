"""Shared helpers for worker/flow/CLI tests: tiny inputs, direct reference runs, bitwise export comparison,
subprocess flows, installed fault plans and waiting for their markers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.faults import FaultPlan

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FAULT_SITE = TESTS / "support" / "faultsite"  # sitecustomize: SUPPORT_FAULT_PLAN installs a plan at start-up

THREADS = 1
_REFERENCES: dict[tuple[Any, ...], str] = {}


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return str(path)


def make_space(root: Path) -> dict[str, Any]:
    """What the flow test modules share per module: inputs and one tiny model directory per architecture."""
    return {
        "root": root,
        "inputs": make_inputs(root / "data"),
        "span": tiny_model_dir(root, "span"),
        "boundary": tiny_model_dir(root, "boundary"),
    }


GROUPS = ("checkpointing", "execution", "lease")  # train_flow's parameter groups (flows/params.py)


def space_params(space: dict[str, Any], run_key: str, **overrides: Any) -> dict[str, Any]:
    """train_flow parameters for the space's tiny span model on its inputs, the suite's training config,
    checkpoints every 2 updates under <root>/runs; `overrides` replace or add parameters (a group's fields are
    merged into the group: ``checkpointing={"keep_checkpoints": None}`` keeps checkpoint_every=2)."""
    from support.config import training_config

    base = {
        "model": space["span"],
        "train_data": space["inputs"]["train"],
        "valid_data": space["inputs"]["valid"],
        "config": training_config(),
        "run_key": run_key,
        "storage": str(space["root"] / "runs"),
        "checkpointing": {"checkpoint_every": 2},
    }
    return merge_params(base, overrides)


def merge_params(params: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`params` with `overrides` applied; the fields of a parameter group are merged into that group."""
    merged = dict(params)
    for name, value in overrides.items():
        if name in GROUPS and isinstance(value, dict):
            merged[name] = {**merged.get(name, {}), **value}
        else:
            merged[name] = value
    return merged


def with_threads(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with the suite's worker thread count unless they set cpu_threads."""
    return merge_params({"execution": {"cpu_threads": THREADS}}, params)


def make_inputs(directory: Path, *, n_train: int = 12, n_valid: int = 4) -> dict[str, str]:
    """Training/validation JSONL files of tiny records (deterministic)."""
    from prefect_gliner2.training.tiny import tiny_records

    directory.mkdir(parents=True, exist_ok=True)
    return {
        "train": write_jsonl(directory / "train.jsonl", tiny_records(n_train, seed=5)),
        "valid": write_jsonl(directory / "valid.jsonl", tiny_records(n_valid, seed=99)),
    }


def tiny_model_dir(root: Path, architecture: str) -> str:
    """A tiny model directory (hidden 32, dropout 0.1 so RNG streams matter), built once per root."""
    from prefect_gliner2.training.tiny import save_tiny_model

    path = root / f"tiny-{architecture}"
    if not (path / "model.safetensors").exists():
        save_tiny_model(path, architecture, seed=3, dropout=0.1)
    return str(path)


def reference_export(
    model: str, inputs: dict[str, str], cfg: dict[str, Any], out: Path, *, with_valid: bool = True
) -> str:
    """Export of a direct, uninterrupted in-process ManagedTraining run of the same plan, cached for the pytest
    process by the content of the model and data (modules whose tiny models and records are byte for byte the same
    share one reference run)."""
    valid = _content(inputs["valid"]) if with_valid else None
    key = (_content(model), _content(inputs["train"]), valid, json.dumps(cfg, sort_keys=True))
    if key in _REFERENCES:
        return _REFERENCES[key]
    import torch

    from prefect_gliner2.runtime.model_sources import load_model, model_architecture
    from prefect_gliner2.session_core.records import load_records
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession

    torch.set_num_threads(THREADS)
    plan = ManagedTrainingPlan(inputs["train"], TrainingConfig.from_dict(cfg), architecture=model_architecture(model))
    evals = load_records(inputs["valid"], what="validation").examples() if with_valid else None
    session = TrainingSession(load_model(model), plan.config, max_steps=plan.max_steps)
    run = ManagedTraining(session, plan, eval_examples=evals)
    try:
        run.run()
        run.export_weights(str(out), which="best")
    finally:
        run.close()
    _REFERENCES[key] = str(out)
    return str(out)


def _content(source: str) -> str:
    """A file's or directory's content digest (names and bytes); any other model source (``tiny:span``) as given."""
    path = Path(source)
    if not path.exists():
        return source
    digest = hashlib.sha256()
    for item in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        digest.update(f"{item.relative_to(path) if item != path else ''}\0".encode())
        digest.update(item.read_bytes())
    return digest.hexdigest()


def export_tensors(directory: str) -> dict[str, Any]:
    """Every tensor of the export's model.safetensors and adapter weights, keyed by file/name."""
    import safetensors.torch

    found: dict[str, Any] = {}
    for path in sorted(Path(directory).rglob("*.safetensors")):
        relative = path.relative_to(directory)
        for name, tensor in safetensors.torch.load_file(str(path)).items():
            found[f"{relative}/{name}"] = tensor
    return found


def assert_same_export(a: str, b: str) -> None:
    import torch

    left, right = export_tensors(a), export_tensors(b)
    assert left and sorted(left) == sorted(right), f"different tensor sets: {sorted(set(left) ^ set(right))[:5]}"
    differing = [k for k in left if left[k].dtype != right[k].dtype or not torch.equal(left[k], right[k])]
    assert not differing, f"{len(differing)} of {len(left)} tensors differ, e.g. {differing[:3]}"


def run_flow(**params: Any) -> dict[str, Any]:
    from prefect_gliner2.flows.train import train_flow

    return train_flow(**with_threads(params))


@contextlib.contextmanager
def installed_faults(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Install `plan` in this (the flow's) process for the duration; flows started meanwhile pass it to workers."""
    faults.install(plan)
    try:
        yield plan
    finally:
        faults.uninstall()


def flow_child(
    params: dict[str, Any], plan: FaultPlan | None, api_url: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Run train_flow in a fresh interpreter (``python -m support.flow_child``) against the shared test server,
    with `plan` installed there (and `env` added to its environment, e.g. object-store credentials)."""
    pythonpath = os.pathsep.join([str(TESTS), str(ROOT)])
    full_env = dict(os.environ, PYTHONPATH=pythonpath, PREFECT_API_URL=api_url, **(env or {}))
    params = with_threads(params)
    plan_json = plan.to_json() if plan is not None else ""
    return subprocess.Popen(
        [sys.executable, "-m", "support.flow_child", json.dumps(params), plan_json],
        cwd=str(ROOT),
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_marker(
    markers: Path, name: str, process: subprocess.Popen[str] | None = None, timeout: float = 120
) -> int:
    """Wait until a fault plan's marker markers/<name> appears; returns the pid recorded in it."""
    path = markers / name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text())
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"process exited ({process.returncode}) before {name}:\n"
                f"{process.stdout.read() if process.stdout else ''}"
            )
        time.sleep(0.05)
    raise AssertionError(f"marker {name} did not appear within {timeout} s")
