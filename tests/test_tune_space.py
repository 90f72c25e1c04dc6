"""Search space files: what they accept, and every refusal, said with the file, the line and the field, before any
training starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.tune import check_study
from prefect_gliner2.session_core import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.search_space import load_search_space, parse_search_space

from support.config import training_config
from support.flow import make_inputs

GOOD = """\
params:
  encoder_lr: {type: float, low: 1e-5, high: 1.0e-3, log: true}
  num_epochs: {type: int, low: 2, high: 8, step: 2}
  scheduler_type: {type: categorical, choices: [linear, cosine]}
  batch_size: [2, 4]
pruner: {type: hyperband, min_resource: 2, max_resource: 18, reduction_factor: 3}
sampler: {type: tpe, n_startup_trials: 4}
"""


def test_a_space_file_reads_floats_ints_and_categoricals(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(GOOD)
    space = load_search_space(str(path))
    params = {p.name: p for p in space.params}
    assert (params["encoder_lr"].low, params["encoder_lr"].high, params["encoder_lr"].log) == (1e-5, 1e-3, True)
    assert (params["num_epochs"].kind, params["num_epochs"].step) == ("int", 2)
    assert params["batch_size"].choices == (2, 4) and params["scheduler_type"].choices == ("linear", "cosine")
    assert (space.pruner.kind, space.pruner.min_resource, space.pruner.max_resource) == ("hyperband", 2, 18)
    assert parse_search_space(space.to_dict(), "the search space") == space  # a flow parameter reads back the same
    space.check_against(TrainingConfig.from_dict(training_config()))


def _space(**params: Any) -> dict[str, Any]:
    return {"params": params}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _space(encoder_lrr={"type": "float", "low": 1, "high": 2}),
            r"encoder_lrr: not a TrainingConfig field \(did you mean 'encoder_lr'\?\)",
        ),
        (_space(metric_for_best=["eval_f1", "eval_loss"]), "metric_for_best cannot be searched: the study's objective"),
        (_space(eval_strategy=["epoch", "steps"]), "eval_strategy cannot be searched: trials pause at validation"),
        (_space(bf16=[True, False]), "bf16 cannot be searched"),
        (_space(encoder_lr={"type": "float", "low": 1e-3, "high": 1e-5}), r"low \(0.001\) must be below high"),
        (_space(encoder_lr={"type": "float", "low": 0.0, "high": 1e-3, "log": True}), "a log range needs low > 0"),
        (_space(encoder_lr={"type": "float", "low": "abc", "high": 1e-3}), "`low:` must be a finite number, got 'abc'"),
        (_space(encoder_lr={"type": "float", "low": 1e-5, "high": float("inf")}), "`high:` must be a finite number"),
        (
            _space(encoder_lr={"type": "int", "low": 1, "high": 3}),
            r"encoder_lr is a float \| None field: use `type: float`",
        ),
        (
            _space(num_epochs={"type": "float", "low": 1, "high": 3}),
            r"num_epochs is an int \| None field: use `type: int`",
        ),
        (_space(num_epochs={"type": "int", "low": 1.5, "high": 3}), "`low:` must be an integer, got 1.5"),
        (_space(num_epochs={"type": "int", "low": 1, "high": 9, "step": 0}), "step must be > 0"),
        (
            _space(encoder_lr={"type": "float", "low": 1e-5, "high": 1e-3, "log": True, "step": 1e-5}),
            "a log range cannot have a step",
        ),
        (
            _space(encoder_lr={"type": "float", "low": 1e-5, "high": 1e-3, "lo": 1}),
            r"unknown key\(s\) \['lo'\] for a float",
        ),
        (_space(encoder_lr={"low": 1e-5, "high": 1e-3}), "encoder_lr needs `type:` one of"),
        (_space(seed=[]), "`choices:` must be a non-empty list"),
        (_space(seed=[1, 1]), "repeat a value"),
        (_space(seed=[[1, 2]]), "choices must be numbers, strings, booleans or null"),
        ({"params": {}}, "`params:` must map TrainingConfig field names"),
        ({"param": {"seed": [1, 2]}}, r"unknown section\(s\) \['param'\]"),
        ({**_space(seed=[1, 2]), "pruner": {"type": "median"}}, "pruner.type must be one of"),
        ({**_space(seed=[1, 2]), "pruner": {"reduction_factor": 1}}, "reduction_factor must be >= 2"),
        ({**_space(seed=[1, 2]), "pruner": {"min_resource": 0}}, "min_resource must be a positive integer"),
        ({**_space(seed=[1, 2]), "pruner": {"max_resource": 9}}, "max_resource is a hyperband setting"),
        (
            {**_space(seed=[1, 2]), "pruner": {"type": "hyperband", "min_resource": 9, "max_resource": 3}},
            r"max_resource \(3\) must be >= min_resource \(9\)",
        ),
        ({**_space(seed=[1, 2]), "sampler": {"type": "grid"}}, "sampler.type must be one of"),
        ({**_space(seed=[1, 2]), "sampler": {"n_startup_trials": -1}}, "n_startup_trials must be an integer >= 0"),
    ],
)
def test_bad_spaces_are_refused_saying_what_and_where(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_search_space(data, "space.yaml")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"warmup_ratio": {"type": "float", "low": 0.1, "high": 2.0}}, r"warmup_ratio: 2.0 does not make a valid"),
        ({"scheduler_type": ["linear", "bogus"]}, r"scheduler_type: 'bogus' does not make a valid"),
        ({"batch_size": {"type": "int", "low": 0, "high": 4}}, r"batch_size: 0 does not make a valid"),
    ],
)
def test_values_the_config_refuses_are_refused_before_any_training(params: Any, message: str) -> None:
    space = parse_search_space({"params": params}, "space.yaml")
    with pytest.raises(ConfigError, match=message):
        space.check_against(TrainingConfig.from_dict(training_config()))


def test_the_file_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("params:\n  seed: [1, 2]\n  encoder_lr: {type: float, low: 1, high: 0.5}\n")
    with pytest.raises(ConfigError, match=rf"{path}, line 3: params.encoder_lr: low \(1.0\) must be below high"):
        load_search_space(str(path))
    path.write_text("params: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_search_space(str(path))
    with pytest.raises(ConfigError, match="cannot be read"):
        load_search_space(str(tmp_path / "missing.yaml"))


def test_a_study_without_validation_is_refused(tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path)
    space = parse_search_space(_space(seed=[1, 2]))
    base = {"model": "tiny:span", "train_data": inputs["train"], "config": training_config()}
    with pytest.raises(ConfigError, match="a study selects by the validation metric"):
        check_study(base, space, "s")
    base = {**base, "valid_data": inputs["valid"], "config": training_config(eval_strategy="no")}
    with pytest.raises(ConfigError, match="a study selects by the validation metric"):
        check_study(base, space, "s")
    with pytest.raises(ConfigError, match=r"base sets \['run_key'\]"):
        check_study({**base, "run_key": "mine"}, space, "s")
    with pytest.raises(ConfigError, match="remove pause_at_step from base"):
        check_study({**base, "pause_at_step": 3}, space, "s")


def test_the_command_refuses_a_bad_space_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_gliner2.flows.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # a server start would show in the time, not be needed
    inputs = make_inputs(tmp_path / "data")
    config = tmp_path / "config.yaml"
    config.write_text("fp16: false\nbf16: false\nnum_epochs: 2\n")
    space = tmp_path / "space.yaml"
    space.write_text(
        "params:\n  encoder_lr: {type: float, low: 1e-5, high: 1e-3, log: true}\n  warmup_ratio: [0.1, 3]\n"
    )
    runs, study = tmp_path / "runs", tmp_path / "study.db"
    argv = ["tune", "--model", "tiny:span", "--train", inputs["train"], "--valid", inputs["valid"]]
    argv += ["--config", str(config), "--space", str(space), "--trials", "2", "--run-storage", str(runs)]
    argv += ["--storage", f"sqlite:///{study}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "prefect-gliner2 tune: error: " in err and "params.warmup_ratio: 3 does not make a valid" in err, err
    assert not runs.exists() and not study.exists()  # nothing trained, no study created
    assert main([*argv[:-1], f"sqlite:///{study}", "--parallel", "2"]) == 2
    assert "--parallel needs --deployment" in capsys.readouterr().err
