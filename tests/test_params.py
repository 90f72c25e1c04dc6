"""The run form's parameter model against a loopback Prefect server: every config the session would refuse is
refused by the server's parameter validation (no flow run is created) or fails the flow run before any task runs,
and in-process validation refuses it with the session's own message."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.flows.params import FIXED_FIELDS, TrainingSettings
from prefect_gliner2.flows.train import train_flow
from prefect_gliner2.session_core import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError

from support.config import training_config
from support.flow import ROOT, make_inputs, merge_params
from support.processes import serving

NAME = "gliner2-train/form-check"
SERVE = (
    "from prefect import serve\n"
    "from prefect_gliner2.flows.train import train_flow\n"
    "serve(train_flow.to_deployment(name='form-check', enforce_parameter_schema=True))\n"
)


@pytest.fixture(scope="module")
def served(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("form")
    inputs = make_inputs(root / "data", n_train=4, n_valid=2)
    log_path = root / "serve.log"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        PREFECT_API_URL=prefect_server,
        PREFECT_GLINER2_STORAGE=str(root / "runs"),
        PREFECT_RUNNER_POLL_FREQUENCY="1",
    )
    with serving([sys.executable, "-c", SERVE], env, log_path):
        yield {"root": root, "inputs": inputs, "log": log_path}


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _runs_of(name: str) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with _client() as client:
        deployment = client.read_deployment_by_name(name)
        return list(
            client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
        )


def _task_runs(flow_run_id: UUID) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with _client() as client:
        return list(client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))))


def _wait_final(flow_run_id: UUID, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    with _client() as client:
        while True:
            state = client.read_flow_run(flow_run_id).state
            if (state is not None and state.is_final()) or time.monotonic() > deadline:
                return state
            time.sleep(0.5)


def _params(served: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    values = {
        "model": "tiny:span",
        "train_data": served["inputs"]["train"],
        "valid_data": served["inputs"]["valid"],
        "config": {"precision": "fp32", "num_epochs": 1},
        "run_key": "form",
        "execution": {"cpu_threads": 1},
    }
    return merge_params(values, overrides)


# (case, config or other parameters, a word of the server's refusal)
SERVER_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("wrong type", {"config": {"batch_size": "abc"}}, "batch_size"),
    ("count out of range", {"config": {"batch_size": 0}}, "batch_size"),
    ("max_steps zero", {"config": {"max_steps": 0}}, "max_steps"),
    ("beta out of range", {"config": {"advanced": {"adam_beta1": 1.0}}}, "adam_beta1"),
    ("lora dropout 1", {"config": {"use_lora": True, "lora_dropout": 1.0}}, "lora_dropout"),
    ("precision fp16", {"config": {"precision": "fp16"}}, "precision"),
    ("unknown scheduler", {"config": {"scheduler_type": "warp"}}, "scheduler_type"),
    ("metric not computed", {"config": {"metric_for_best": "accuracy"}}, "metric_for_best"),
    ("early stopping without validation points", {"config": {"early_stopping": True, "eval_strategy": "no"}}, "no"),
    ("refused field num_workers", {"config": {"num_workers": 2}}, "num_workers"),
    ("refused field skip_step_errors", {"config": {"skip_step_errors": True}}, "skip_step_errors"),
    ("internal field output_dir", {"config": {"output_dir": "/tmp/x"}}, "output_dir"),
    ("native fp16 field", {"config": {"fp16": True}}, "fp16"),
    ("empty LoRA targets", {"config": {"advanced": {"lora_target_modules": []}}}, "lora_target_modules"),
    ("unknown device", {"execution": {"device": "gpu"}}, "device"),
    ("pipeline depth out of range", {"execution": {"pipeline_depth": 65}}, "pipeline_depth"),
    ("checkpoint retention zero", {"checkpointing": {"keep_checkpoints": 0}}, "keep_checkpoints"),
    ("unknown lease field", {"lease": {"ttl": 5}}, "ttl"),
    ("model missing", {"model": None}, "model"),
]


@pytest.mark.parametrize(("case", "bad", "word"), SERVER_REFUSED, ids=[c[0] for c in SERVER_REFUSED])
def test_the_server_refuses_a_doomed_config_before_a_run_exists(
    served: dict[str, Any], case: str, bad: dict[str, Any], word: str
) -> None:
    from prefect.deployments import run_deployment

    params = _params(served, **bad)
    if params["model"] is None:
        del params["model"]
    before = len(_runs_of(NAME))
    with pytest.raises(Exception, match="(?i)validation") as raised:
        run_deployment(NAME, parameters=params, timeout=0)
    assert word in str(raised.value), f"{case}: {raised.value}"
    assert len(_runs_of(NAME)) == before, f"{case}: a flow run was created"
    # In-process (a Python caller), the same parameters are refused by the flow's own validation.
    from prefect.exceptions import ParameterTypeError

    with pytest.raises(ParameterTypeError):
        train_flow.validate_parameters(params)


# (case, parameters, words of the failed run's message): accepted by the schema, refused before any task runs
RUN_REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "early stopping without validation data",
        {"valid_data": None, "config": {"precision": "fp32", "early_stopping": True}},
        ["early_stopping=True needs eval_examples"],
    ),
    (
        "bf16 on the CPU",
        {"execution": {"device": "cpu"}, "config": {"precision": "bf16"}},
        ["bf16=True needs a CUDA device with native bf16"],
    ),
]


@pytest.mark.parametrize(("case", "bad", "words"), RUN_REFUSED, ids=[c[0] for c in RUN_REFUSED])
def test_a_config_the_worker_would_refuse_fails_the_run_before_any_task(
    served: dict[str, Any], case: str, bad: dict[str, Any], words: list[str]
) -> None:
    from prefect.deployments import run_deployment

    run = run_deployment(NAME, parameters=_params(served, **bad), timeout=0)
    state = _wait_final(run.id)
    assert state is not None and state.is_failed(), (case, state, served["log"].read_text()[-3000:])
    with _client() as client:
        message = str(client.read_flow_run(run.id).state.message) + served["log"].read_text()
    for word in words:
        assert word in message, f"{case}: {word!r} not in the run's message or logs"
    assert _task_runs(run.id) == [], f"{case}: a task ran"
    assert not (served["root"] / "runs" / "form").exists(), f"{case}: a run directory was created"


def test_the_form_runs_a_valid_config(served: dict[str, Any]) -> None:
    """The control: the same deployment trains with a valid form config (so the refusals above are specific)."""
    from prefect.deployments import run_deployment

    run = run_deployment(NAME, parameters=_params(served, run_key="form-ok"), timeout=0)
    state = _wait_final(run.id, timeout=240)
    assert state is not None and state.is_completed(), (state, served["log"].read_text()[-3000:])
    assert (served["root"] / "runs" / "form-ok" / "export" / "export.json").exists()
    assert len(_task_runs(run.id)) > 0


NATIVE_REFUSED = [
    {"fp16": True, "bf16": False},
    {"fp16": None, "bf16": False},
    {"num_workers": 2},
    {"local_rank": 0},
    {"compile_model": True},
    {"skip_step_errors": True},
    {"allow_invalid_samples": True},
    {"on_capacity_exceeded": "truncate"},
    {"strict_training": False},
    {"ignore_nonfinite_losses": True},
    {"max_train_samples": 10},
    {"max_eval_samples": 10},
    {"batch_size": 0},
    {"learning_rate_schedule": "cosine"},
    {"early_stopping": True, "eval_strategy": "no"},
]


@pytest.mark.parametrize("bad", NATIVE_REFUSED, ids=[",".join(b) for b in NATIVE_REFUSED])
def test_flat_training_config_fields_are_refused_with_the_sessions_message(bad: dict[str, Any]) -> None:
    flat = {**training_config(), **bad}
    with pytest.raises(ConfigError) as native:
        TrainingConfig.from_dict(flat)
    with pytest.raises(ValueError) as form:
        TrainingSettings.model_validate(flat)
    assert str(native.value) in str(form.value)


def test_one_conversion_keeps_every_native_value() -> None:
    flat = training_config(use_lora=True, scheduler_type="cosine", gradient_checkpointing=True, max_len=64)
    settings = TrainingSettings.model_validate(flat)
    assert settings.to_training_config() == TrainingConfig.from_dict(flat)
    assert settings.to_training_config() is settings.to_training_config()  # built once, when validated
    assert settings.precision == "fp32" and settings.advanced.gradient_checkpointing
    again = TrainingSettings.model_validate(settings.model_dump(mode="json"))  # what the form submits
    assert again.to_training_config() == TrainingConfig.from_dict(flat)
    assert TrainingSettings(precision="bf16").to_training_config().bf16 is True
    with pytest.raises(ValueError, match="output_dir"):
        TrainingSettings.model_validate({**flat, "output_dir": "/elsewhere"})


def test_the_form_offers_no_refused_field_and_no_html_in_descriptions() -> None:
    schema = train_flow.parameters.model_dump(mode="json")
    config_schema = schema["definitions"]["TrainingSettings"]
    offered = set(config_schema["properties"]) | set(schema["definitions"]["AdvancedSettings"]["properties"])
    assert not offered & FIXED_FIELDS
    assert config_schema["properties"]["precision"]["enum"] == ["fp32", "bf16"]
    assert config_schema["properties"]["scheduler_type"]["enum"] == ["linear", "cosine", "cosine_restarts", "constant"]
    texts = [p.get("description", "") for p in schema["properties"].values()]
    for definition in schema["definitions"].values():
        texts += [definition.get("description", "")] + [
            p.get("description", "") for p in definition["properties"].values()
        ]
    assert all(text for text in texts[: len(schema["properties"])]), "every flow parameter is described"
    assert not [t for t in texts if "<" in t or ">" in t], "angle brackets are swallowed as HTML by the UI"


def test_background_checkpoints_is_an_opt_in_flow_parameter_that_states_its_ram_cost() -> None:
    """A flow parameter (how checkpoints are written, not what is trained: it is not part of the training config
    or the plan, so a resumed run may switch it), off by default, described on the form with its memory cost."""
    schema = train_flow.parameters.model_dump(mode="json")
    field = schema["definitions"]["CheckpointSettings"]["properties"]["background_checkpoints"]
    assert field["default"] is False and field["type"] == "boolean"
    description = " ".join(field["description"].split())
    assert "one checkpoint's size of extra host RAM" in description
    assert "background_checkpoints" not in schema["definitions"]["TrainingSettings"]["properties"]
