"""Planning, storage and checkpoint files, event names and report text, the run lifecycle and the console script
import no torch, numpy, transformers, gliner2 or prefect."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "numpy", "transformers", "gliner2", "prefect")

_SCRIPT = """
import sys, tempfile, os
sys.path.insert(0, {root!r})
import prefect_gliner2.session_core as session_core
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.manifest import read_manifest, write_manifest
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
from prefect_gliner2.session_core.records import load_records
from prefect_gliner2.session_core import layout, storage
from prefect_gliner2.session_core.checkpoint import read_checkpoint, write_checkpoint

records = [
    {{"input": "John met Mary in Paris %d." % i, "output": {{"entities": {{"person": ["John", "Mary"]}}}}}}
    for i in range(9)
]
config = TrainingConfig(num_workers=0, fp16=False, bf16=True, batch_size=2, gradient_accumulation_steps=2, num_epochs=2)
config.to_native_kwargs()
config = TrainingConfig.from_dict(config.to_dict())
plan = ManagedTrainingPlan(records, config, architecture="boundary")
plan.batch(0)
manifest = plan.to_manifest(eval_examples=records[:2])
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "m.json")
    write_manifest(manifest, path)
    loaded, evals = ManagedTrainingPlan.from_manifest(read_manifest(path))
    checkpoint = os.path.join(tmp, layout.CHECKPOINTS_DIR, layout.checkpoint_name(1, 2))
    write_checkpoint(checkpoint, {{"a.bin": b"a"}}, {{}})
    assert read_checkpoint(checkpoint).require("a.bin") == b"a"
    assert storage.remove_debris(*storage.resolve(os.path.join(tmp, layout.CHECKPOINTS_DIR))) == []
assert loaded.fingerprint == plan.fingerprint and len(evals) == 2
assert session_core.ManagedTrainingPlan is ManagedTrainingPlan and session_core.TrainingConfig is TrainingConfig
import prefect_gliner2
assert prefect_gliner2.ManagedTrainingPlan is ManagedTrainingPlan and prefect_gliner2.TrainingConfig is TrainingConfig
heavy = sorted(m for m in {heavy!r} if m in sys.modules or any(k.startswith(m + ".") for k in sys.modules))
print(",".join(heavy) or "none")
"""


def test_planning_imports_no_heavy_modules() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(root=ROOT, heavy=HEAVY)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none", f"planning imported {done.stdout.strip()}"


def test_each_planning_module_alone_is_light() -> None:
    modules = (
        "prefect_gliner2",
        "prefect_gliner2.session_core.config",
        "prefect_gliner2.session_core.records",
        "prefect_gliner2.session_core.plan",
        "prefect_gliner2.session_core.manifest",
        "prefect_gliner2.session_core.search_space",
    )
    for module in modules:
        assert _heavy_after_import(module) == "[]", module


def _heavy_after_import(module: str) -> str:
    """The heavy modules a fresh interpreter has loaded after importing `module` alone."""
    script = (
        f"import sys; sys.path.insert(0, {ROOT!r}); import {module}; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_event_names_and_report_text_import_no_heavy_modules() -> None:
    """What an automation matches on (event names, resources, payloads) and what the reports say need no Prefect."""
    for module in ("prefect_gliner2.runtime.events", "prefect_gliner2.flows.report_text"):
        assert _heavy_after_import(module) == "[]", module


def test_the_run_lifecycle_and_the_cli_import_no_heavy_modules() -> None:
    """Preparing, opening and finishing a run, the run form's models and the console script need no Prefect or
    torch until a command runs (runtime.run reaches Prefect only through the hooks a flow passes in)."""
    modules = (
        "prefect_gliner2.runtime.prepare",
        "prefect_gliner2.runtime.run",
        "prefect_gliner2.runtime.pause",
        "prefect_gliner2.flows.params",
        "prefect_gliner2.flows.cli",
    )
    for module in modules:
        assert _heavy_after_import(module) == "[]", module


PACKAGE_FOLDERS = ("session_core", "training", "runtime", "tasks", "flows", "model_registry", "deployments")


def test_folders_refuse_their_bare_names_from_a_checkout() -> None:
    """A script or notebook run from the checkout has the folders on sys.path under their bare names: importing
    one that way would load a second copy of every module (``config must be a TrainingConfig, got
    TrainingConfig``), so each refuses and names the import to use."""
    for folder in PACKAGE_FOLDERS:
        done = subprocess.run(
            [sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 1, (folder, done.stdout, done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ImportError: import prefect_gliner2.{folder}, not {folder}:"), last


def test_the_namespace_imports_from_a_checkout_as_one_copy() -> None:
    script = (
        "from prefect_gliner2.session_core import ConfigError, ManagedTrainingPlan, TrainingConfig\n"
        "import prefect_gliner2.session_core.config as config_module, sys\n"
        "assert TrainingConfig is config_module.TrainingConfig\n"
        "try:\n"
        "    TrainingConfig(fp16=False, bf16=False, batch_size=0)\n"
        "except ConfigError as exc:\n"
        "    print('caught', type(exc).__module__)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {PACKAGE_FOLDERS!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["caught prefect_gliner2.session_core.errors", "[]"], done.stdout
