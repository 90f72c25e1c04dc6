"""The bad-input catalogue for the flow and the console script (session_core's is tests/test_bad_inputs.py).

Each case names the bad input, how it is refused (an exact error class from ``train_flow``, or exit status 2 from
``prefect-gliner2``) and words the message must contain: what was wrong and what to do. Every case digests the
inputs and the storage (an existing run directory included) before and after: nothing may be damaged or created.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prefect.exceptions import ParameterBindError

from prefect_gliner2.flows.cli import main
from prefect_gliner2.runtime.errors import RunConflictError, RunKeyError
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.training.tiny import tiny_records

from support.config import training_config
from support.flow import make_inputs

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Inputs, configs, a plain file, an empty directory and a run key that already holds another plan."""
    root = tmp_path_factory.mktemp("bad-flow")
    make_inputs(root / "data")
    (root / "data" / "config.json").write_text(json.dumps(training_config()))
    (root / "data" / "broken.json").write_text('{"fp16": false, "bf16": ')
    (root / "data" / "unknown.yaml").write_text("fp16: false\nbf16: false\nlearning_rate_schedule: cosine\n")
    (root / "data" / "not-a-file.yaml").mkdir()
    (root / "data" / "plain-file").write_text("not a directory\n")
    (root / "data" / "empty-model").mkdir()
    taken = RunDirectory(str(root / "runs"), "taken")
    taken.create()
    other = ManagedTrainingPlan(
        tiny_records(6, seed=1), TrainingConfig.from_dict(training_config()), architecture="span"
    )
    taken.ensure_manifest(other.manifest_bytes())
    return root


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.name == ".lease":  # lock metadata a refused run may leave; never part of a run's content
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(oct(path.stat().st_mode).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def flow_params(root: Path, **overrides: Any) -> dict[str, Any]:
    data = root / "data"
    values: dict[str, Any] = dict(
        model="tiny:span",
        train_data=str(data / "train.jsonl"),
        valid_data=str(data / "valid.jsonl"),
        config=training_config(),
        run_key="fresh",
        storage=str(root / "runs"),
        execution={"cpu_threads": 1},
    )
    values.update(overrides)
    return values


def cli_args(root: Path, *extra: str, **overrides: str) -> list[str]:
    data = root / "data"
    values = {
        "--model": "tiny:span",
        "--train": str(data / "train.jsonl"),
        "--valid": str(data / "valid.jsonl"),
        "--config": str(data / "config.json"),
        "--run-key": "fresh",
        "--storage": str(root / "runs"),
        **overrides,
    }
    return ["train", *[item for pair in values.items() for item in pair if item is not None], *extra]


def _flow(**overrides: Any) -> Callable[[Path], Any]:
    def call(root: Path) -> Any:
        from prefect_gliner2.flows.train import train_flow

        return train_flow(**flow_params(root, **overrides))

    return call


def _cli(*extra: str, **overrides: str) -> Callable[[Path], Any]:
    return lambda root: main(cli_args(root, *extra, **{f"--{k.replace('_', '-')}": v for k, v in overrides.items()}))


def _validation_error() -> type[Exception]:
    from prefect.exceptions import ParameterTypeError

    return ParameterTypeError


CLI = "exit 2"
CASES: list[Any] = [
    # ---- console script: exit 2, the message on stderr --------------------------------------------------------
    (
        "cli: --train missing",
        lambda root: main(["train", "--model", "tiny:span", "--config", "x.json"]),
        CLI,
        ["the following arguments are required: --train"],
    ),
    ("cli: --batches-per-task 0", _cli("--batches-per-task", "0"), CLI, ["--batches-per-task", "must be >= 1, got 0"]),
    ("cli: --cpu-threads -2", _cli("--cpu-threads", "-2"), CLI, ["--cpu-threads", "must be >= 0, got -2"]),
    (
        "cli: config file is not valid JSON",
        lambda root: main(cli_args(root, **{"--config": str(root / "data/broken.json")})),
        CLI,
        ["broken.json"],
    ),
    (
        "cli: unknown field in a YAML config",
        lambda root: main(cli_args(root, **{"--config": str(root / "data/unknown.yaml")})),
        CLI,
        ["learning_rate_schedule"],
    ),
    pytest.param(
        "cli: config path is a directory",
        lambda root: main(cli_args(root, **{"--config": str(root / "data/not-a-file.yaml")})),
        CLI,
        ["not-a-file.yaml"],
    ),
    pytest.param(
        "cli: config file does not exist",
        lambda root: main(cli_args(root, **{"--config": str(root / "data/none.yaml")})),
        CLI,
        ["none.yaml"],
    ),
    (
        "cli: model dir holds no model",
        lambda root: main(cli_args(root, **{"--model": str(root / "data/empty-model")})),
        CLI,
        ["empty-model", "has no config.json", "pass a directory written by save_pretrained"],
    ),
    ("cli: run key with a slash", _cli(run_key="a/b"), CLI, ["invalid run key 'a/b'", "without '..' or slashes"]),
    pytest.param(
        "cli: storage below a plain file",
        lambda root: main(cli_args(root, **{"--storage": str(root / "data/plain-file/sub")})),
        CLI,
        ["plain-file"],
    ),
    # ---- flow parameters: the exact error class ----------------------------------------------------------------
    (
        "flow: invalid TrainingConfig value",
        _flow(config={**training_config(), "batch_size": 0}),
        "validation",
        ["batch_size must be >= 1"],
    ),
    (
        "flow: unknown TrainingConfig field",
        _flow(config={**training_config(), "learning_rate_schedule": "cosine"}),
        "validation",
        ["learning_rate_schedule"],
    ),
    ("flow: pipeline_depth out of range", _flow(execution={"pipeline_depth": 65}), "validation", ["pipeline_depth"]),
    (
        "flow: a flat run setting of the earlier signature",
        _flow(checkpoint_every=2),
        ParameterBindError,
        ["unexpected keyword argument 'checkpoint_every'"],
    ),
    ("flow: unknown built-in model", _flow(model="tiny:gpt"), ConfigError, ["unknown built-in model"]),
    (
        "flow: nonexistent model directory",
        lambda root: _flow(model=str(root / "no" / "model"))(root),
        ConfigError,
        ["is not a model directory"],
    ),
    ("flow: run key '../x'", _flow(run_key="../x"), RunKeyError, ["invalid run key '../x'", "e.g. 'ner-2024-06-01'"]),
    ("flow: empty run key", _flow(run_key=""), RunKeyError, ["invalid run key ''"]),
    (
        "flow: training data file missing",
        lambda root: _flow(train_data=str(root / "data" / "gone.jsonl"))(root),
        ConfigError,
        ["gone.jsonl", "does not exist"],
    ),
    (
        "flow: resume of an unknown run key",
        _flow(train_data=None, valid_data=None, config=None, run_key="never"),
        ConfigError,
        ["has no manifest", "pass train_data and config"],
    ),
    (
        "flow: different manifest under a run key",
        _flow(run_key="taken"),
        RunConflictError,
        ["already holds a different manifest", "choose a new run key"],
    ),
    (
        "flow: storage below a plain file",
        lambda root: _flow(storage=str(root / "data" / "plain-file" / "sub"))(root),
        "storage",
        ["plain-file"],
    ),
]


@pytest.mark.parametrize(
    ("name", "case", "error", "words"), CASES, ids=[c.values[0] if hasattr(c, "values") else c[0] for c in CASES]
)
def test_bad_flow_input_is_refused_clearly_and_damages_nothing(
    name: str,
    case: Callable[[Path], Any],
    error: Any,
    words: list[str],
    world: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "world"
    shutil.copytree(world, root)
    before = digest(root)
    if error == CLI:
        try:
            code = case(root)
        except SystemExit as exited:  # argparse
            code = exited.code
        message = capsys.readouterr().err
        assert code == 2, f"{name}: exit {code}\n{message}"
    else:
        expected = (
            _validation_error() if error == "validation" else (OSError, ConfigError) if error == "storage" else error
        )
        with pytest.raises(expected) as raised:
            case(root)
        if error not in ("validation", "storage"):
            assert type(raised.value) is error, f"{name}: {type(raised.value).__name__}: {raised.value}"
        message = str(raised.value)
    for word in words:
        assert word in message, f"{name}: {word!r} not in {message!r}"
    assert digest(root) == before, f"{name}: the inputs or the storage changed"
    assert not (root / "runs" / "fresh").exists() and os.listdir(root / "runs") == ["taken"]
