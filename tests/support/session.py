"""Session test support: tiny configs, models and plans, direct loops, snapshots, bitwise comparisons, children."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
from prefect_gliner2.training.tiny import build_tiny_model, tiny_records

from support.config import training_config
from support.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
CASES = [("span", False), ("span", True), ("boundary", False), ("boundary", True)]
CASE_IDS = [f"{a}-{'lora' if lora else 'full'}" for a, lora in CASES]


# The session tests' plan shape: 3 micro-batches per update, no validation points, an output_dir never written.
SESSION_SHAPE: dict[str, Any] = {"output_dir": "unused", "gradient_accumulation_steps": 3, "eval_strategy": "no"}


def make_config(architecture: str, lora: bool, **overrides: Any) -> TrainingConfig:
    """The one test config (``support.config.training_config``) in the session tests' shape, as a TrainingConfig."""
    return TrainingConfig(**training_config(**{**SESSION_SHAPE, "use_lora": lora, **overrides}))


def make_model(architecture: str, directory: str | None = None) -> Any:
    return build_tiny_model(architecture, seed=3, dropout=0.1, directory=directory)


def train_records(n: int = 9) -> list[dict[str, Any]]:
    return tiny_records(n, seed=5)


def eval_records(n: int = 4) -> list[dict[str, Any]]:
    return tiny_records(n, seed=99)


def make_plan(architecture: str, config: TrainingConfig, n: int = 9) -> ManagedTrainingPlan:
    return ManagedTrainingPlan(train_records(n), config, architecture=architecture)


def new_session(arch: str, lora: bool, **overrides: Any) -> tuple[TrainingSession, ManagedTrainingPlan]:
    """A CPU session of the test model and its plan (the test config with `overrides`)."""
    config = make_config(arch, lora, **overrides)
    plan = make_plan(arch, config)
    return TrainingSession(make_model(arch), config, max_steps=plan.max_steps), plan


def run_direct(session: Any, plan: ManagedTrainingPlan, start: int = 0, stop: int | None = None) -> list[float]:
    """The caller's own loop: forward_backward(plan.batch(i)), then optim_step() iff plan.is_update(i)."""
    losses = []
    for i in range(start, plan.batch_count if stop is None else stop):
        losses.append(session.forward_backward(plan.batch(i)))
        if plan.is_update(i):
            session.optim_step()
    return losses


def run_queued(session: Any, plan: ManagedTrainingPlan) -> tuple[list[float], int]:
    """The managed driver's loop: queue_forward_backward(plan.batch(i)), then optim_step() and take_losses() iff
    plan.is_update(i); returns the losses and the number of updates."""
    losses, updates = [], 0
    for i in range(plan.batch_count):
        session.queue_forward_backward(plan.batch(i))
        if plan.is_update(i):
            session.optim_step()
            updates += 1
            losses.extend(session.take_losses())
    return losses, updates


def snapshot(session: Any) -> dict[str, torch.Tensor]:
    """Every parameter, every optimizer tensor and every pending gradient, as CPU copies."""
    out: dict[str, torch.Tensor] = {}
    for name, parameter in session.model.named_parameters():
        out[f"param/{name}"] = parameter.detach().cpu().clone()
        if parameter.grad is not None:
            out[f"grad/{name}"] = parameter.grad.detach().cpu().clone()
    for pid, state in session.engine.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{pid}/{key}"] = value.detach().cpu().clone()
    return out


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b), f"different tensor sets: {sorted(set(a) ^ set(b))[:5]}"
    differing = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not differing, f"{len(differing)} tensors differ, e.g. {differing[:5]}"


def run_child(module: str, args: dict[str, Any], timeout: int = 300, *, interpreter: bool = False) -> dict[str, Any]:
    """Run ``support.<module>`` with JSON args in a new process; returns its JSON result.

    The process is forked from the per-process fork server (``support.forkserver``: torch, transformers and gliner2
    imported once, nothing built), or, with `interpreter` (and always for a CUDA child), a fresh interpreter
    (``python -m support.<module>``)."""
    path = [str(TESTS), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONHASHSEED="123")
    if interpreter or args.get("device", "cpu") != "cpu":
        proc = subprocess.run(
            [sys.executable, "-m", f"support.{module}", json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(ROOT),
        )
    else:
        proc = _fork_server(env).run(module, [json.dumps(args)], timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


_SERVER: list[ForkServer] = []
_PER_TEST = ("PYTEST_CURRENT_TEST",)  # what pytest changes in the environment for every test


def _fork_server(env: dict[str, str]) -> ForkServer:
    """This process's fork server, started (again) when none runs or the environment differs from its own (a
    child inherits the server's environment, and some of it is read only at start-up)."""
    wanted = {k: v for k, v in env.items() if k not in _PER_TEST}
    if _SERVER and ({k: v for k, v in _SERVER[0].env.items() if k not in _PER_TEST} != wanted or not _SERVER[0].alive):
        _SERVER.pop().close()
    if not _SERVER:
        _SERVER.append(ForkServer(wanted, cwd=str(ROOT)))
        atexit.register(_SERVER[0].close)
    return _SERVER[0]
