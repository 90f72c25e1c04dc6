"""The built wheel installs one namespace, prefect_gliner2: next to a Prefect project's own top-level `flows` and
`tasks` packages, both the project's packages and the plugin's import (issue 11, item 1).

The wheel is built from a copy of the sources (nothing is written into the checkout) and installed with --no-deps
into a fresh virtual environment. That environment sees the test environment's dependencies through a .pth file
that lists the test environment's site-packages directory as a plain path: .pth files inside a directory added
that way are not processed, so the editable install of prefect_gliner2 stays out and only the wheel can answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_FOLDERS = ("session_core", "runtime", "tasks", "flows", "model_registry", "deployments")
NOT_SOURCES = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "tests", "bench", "runs", "*-demo")

_IMPORTS = """
import importlib.resources, importlib.util, json, sys
import flows, tasks
import prefect_gliner2, prefect_gliner2.deployments, prefect_gliner2.flows.train, prefect_gliner2.tasks.training
import prefect_gliner2.flows.cli
print(json.dumps({
    "user": [flows.OWNER, tasks.OWNER, flows.__file__, tasks.__file__],
    "plugin": [m.__file__ for m in (prefect_gliner2, prefect_gliner2.flows.train, prefect_gliner2.tasks.training)],
    "train_flow": prefect_gliner2.flows.train.train_flow.name,
    "prefect_yaml": importlib.resources.files("prefect_gliner2.deployments").joinpath("prefect.yaml").is_file(),
    "other_top_level": [n for n in ("session_core", "runtime", "model_registry", "deployments")
                        if importlib.util.find_spec(n) is not None],
}))
"""


def _run(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{' '.join(command)} failed ({done.returncode}):\n{output}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout's sources."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    out = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."], source)
    [built] = list(out.glob("prefect_gliner2-*.whl"))
    return built


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    dist_info = next(name for name in top_level if name.endswith(".dist-info"))
    assert top_level == {"prefect_gliner2", dist_info}, sorted(top_level)
    for folder in PRODUCT_FOLDERS:
        assert f"prefect_gliner2/{folder}/__init__.py" in names, folder
    assert "prefect_gliner2/deployments/prefect.yaml" in names
    assert "prefect_gliner2/flows/cli/train.py" in names  # the console script's package, one module per command
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "prefect-gliner2 = prefect_gliner2.flows.cli:console_main" in entry_points


def test_installed_wheel_imports_next_to_a_projects_own_flows_and_tasks(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")  # a plain path, no .pth run
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)])
    project = tmp_path / "project"  # a Prefect project with its own top-level flows/ and tasks/
    for name in ("flows", "tasks"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"OWNER = 'project {name}'\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = json.loads(_run([str(python), "-c", _IMPORTS], cwd=project, env=env).stdout.strip().splitlines()[-1])
    owners, files = found["user"][:2], [Path(path).resolve() for path in found["user"][2:]]
    assert owners == ["project flows", "project tasks"]
    assert files == [(project / name / "__init__.py").resolve() for name in ("flows", "tasks")]
    for path in found["plugin"]:  # the wheel's copy, not the checkout's editable one
        assert Path(path).resolve().is_relative_to((site / "prefect_gliner2").resolve()), path
    assert found["train_flow"] and found["prefect_yaml"]
    assert found["other_top_level"] == []  # the product folders are not importable as top-level packages
    done = _run([str(venv / "bin" / "prefect-gliner2"), "--help"], cwd=project, env=env)
    assert "usage" in done.stdout.lower()
