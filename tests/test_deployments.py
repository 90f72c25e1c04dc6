"""Deployments against a real Prefect server on loopback: prefect.yaml deploys (schedule, concurrency, work pool),
the server validates parameters before creating a run, and both deployments run to completion when served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.params import TrainingSettings
from prefect_gliner2.training.tiny import tiny_records

from support.config import training_config
from support.flow import ROOT, THREADS, write_jsonl
from support.prefect_harness import delete_deployments
from support.processes import serving

TRAIN, RETRAIN, SWEEP = "gliner2-train/train", "gliner2-retrain/retrain-nightly", "gliner2-sweep/sweep"
TUNE = "gliner2-tune/tune"
EXTRACT = "gliner2-extract/extract"


def form_config(**overrides: Any) -> dict[str, Any]:
    """The test config as the run form submits it (the deployment's schema is the form's)."""
    return TrainingSettings.model_validate(training_config(**overrides)).model_dump(mode="json")


def _env(api_url: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=api_url, PREFECT_CLI_PROMPT="false", **extra)


def _client() -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _flow_run_count(deployment_id: Any) -> int:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with _client() as client:
        return len(
            client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        )


def _assert_refused(name: str, parameters: dict[str, Any]) -> None:
    """The server rejects the parameters (enforced schema) and no flow run is created."""
    from prefect.deployments import run_deployment

    with _client() as client:
        deployment = client.read_deployment_by_name(name)
    before = _flow_run_count(deployment.id)
    with pytest.raises(Exception, match="(?i)validation|invalid|required"):
        run_deployment(name, parameters=parameters, timeout=0)
    assert _flow_run_count(deployment.id) == before


def _assert_nightly_schedule(name: str) -> None:
    with _client() as client:
        deployment = client.read_deployment_by_name(name)
    [schedule] = deployment.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.slug, schedule.active) == (
        "0 3 * * *",
        "Europe/Berlin",
        "nightly-retrain",
        True,
    )
    assert _limit(deployment) == 1 and deployment.enforce_parameter_schema
    assert (
        deployment.concurrency_options is not None and deployment.concurrency_options.collision_strategy == "CANCEL_NEW"
    )


def _limit(deployment: Any) -> int | None:
    limit = deployment.global_concurrency_limit
    return limit.limit if limit is not None else None


def test_prefect_yaml_deploys_to_a_process_pool(prefect_server: str, tmp_path: Path) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with _client() as client:
        try:
            client.create_work_pool(WorkPoolCreate(name="gliner2-process", type="process"))
        except ObjectAlreadyExists:
            pass
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "--no-prompt",
            "deploy",
            "--prefect-file",
            "deployments/prefect.yaml",
            "--all",
        ],
        cwd=str(ROOT),
        env=_env(prefect_server),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with _client() as client:
        train = client.read_deployment_by_name(TRAIN)
        nightly = client.read_deployment_by_name(RETRAIN)
        sweep = client.read_deployment_by_name(SWEEP)
        tune = client.read_deployment_by_name(TUNE)
    assert (train.entrypoint, nightly.entrypoint, sweep.entrypoint, tune.entrypoint) == (
        "prefect_gliner2.flows.train:train_flow",
        "prefect_gliner2.flows.retrain:retrain_flow",
        "prefect_gliner2.flows.sweep:sweep_flow",
        "prefect_gliner2.flows.tune:tune_flow",
    )
    assert train.work_pool_name == nightly.work_pool_name == sweep.work_pool_name == "gliner2-process"
    # a sweep or a study only waits for its runs: on its own queue it never holds a training worker's slot
    assert (train.work_queue_name, sweep.work_queue_name, tune.work_queue_name) == ("default", "sweeps", "sweeps")
    assert "pause_at_step" in train.parameter_openapi_schema["properties"]
    # no deployment-wide limit: runs with different run keys train in parallel; the run-key lease excludes
    assert _limit(train) is None and train.schedules == []
    assert train.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    assert "config" in train.parameter_openapi_schema["properties"]
    _assert_nightly_schedule(RETRAIN)
    TrainingSettings.model_validate(nightly.parameters["config"])  # the scheduled defaults are a valid config
    _assert_refused(TRAIN, {"model": "tiny:span", "config": {"precision": "fp32", "batch_size": "abc"}})
    _assert_refused(TRAIN, {"train_data": "data/train.jsonl"})  # `model` is required

    # What the UI's "Run" button does: a flow run of the deployment, executed by a real process worker
    from prefect.deployments import run_deployment

    data = tmp_path / "data"
    data.mkdir()
    run = run_deployment(
        TRAIN,
        timeout=0,
        parameters={
            "model": "tiny:span",
            "train_data": write_jsonl(data / "train.jsonl", tiny_records(6, seed=5)),
            "valid_data": write_jsonl(data / "valid.jsonl", tiny_records(2, seed=99)),
            "config": form_config(num_epochs=1),
            "run_key": "pool-train",
            "execution": {"cpu_threads": THREADS},
        },
    )
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            "gliner2-process",
            "--run-once",
            "--type",
            "process",
        ],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(
            prefect_server,
            PREFECT_GLINER2_STORAGE=str(tmp_path / "runs"),
            PREFECT_WORKER_QUERY_SECONDS="1",
            PREFECT_WORKER_PREFETCH_SECONDS="60",
        ),
    )
    state = _wait_final(run.id, timeout=60)
    assert state is not None and state.is_completed(), (state, worker.stdout[-4000:], worker.stderr[-4000:])
    assert (tmp_path / "runs" / "pool-train" / "export" / "export.json").exists()


@pytest.fixture()
def served(prefect_server: str, tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    inputs = {
        "train": write_jsonl(data / "train.jsonl", tiny_records(6, seed=5)),
        "valid": write_jsonl(data / "valid.jsonl", tiny_records(2, seed=99)),
    }
    overrides = {
        "retrain-nightly": {
            "model_name": "served",
            "train_data": inputs["train"],
            "valid_data": inputs["valid"],
            "registry_root": str(tmp_path / "registry"),
            "config": form_config(num_epochs=1),
            "execution": {"cpu_threads": THREADS},
        }
    }
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    delete_deployments(TRAIN, RETRAIN, SWEEP, TUNE, EXTRACT)
    command = [
        sys.executable,
        "-m",
        "prefect_gliner2.deployments.serve",
        "--parameters",
        str(tmp_path / "overrides.json"),
    ]
    # the runner looks for scheduled runs every second (its default, 10 s, is idle time in every test)
    env = _env(prefect_server, PREFECT_GLINER2_STORAGE=str(tmp_path / "runs"), PREFECT_RUNNER_POLL_FREQUENCY="1")
    with serving(command, env, tmp_path / "serve.log"):
        yield {"inputs": inputs, "root": tmp_path}


def test_served_deployments_run_and_validate(served: dict[str, Any]) -> None:
    from prefect.deployments import run_deployment

    inputs, root = served["inputs"], served["root"]
    _assert_nightly_schedule(RETRAIN)
    _assert_refused(TRAIN, {"model": "tiny:span", "config": {"precision": "fp32", "batch_size": "abc"}})
    train = run_deployment(
        TRAIN,
        timeout=0,
        parameters={
            "model": "tiny:span",
            "train_data": inputs["train"],
            "valid_data": inputs["valid"],
            "config": form_config(num_epochs=1),
            "run_key": "served-train",
            "execution": {"cpu_threads": THREADS},
        },
    )
    nightly = run_deployment(RETRAIN, timeout=0)
    states = {name: _wait_final(run.id) for name, run in (("train", train), ("retrain", nightly))}
    assert states["train"].is_completed(), (states, (root / "serve.log").read_text()[-4000:])
    assert states["retrain"].is_completed(), (states, (root / "serve.log").read_text()[-4000:])
    assert "promoted served v000001" in (states["retrain"].message or "")
    assert (root / "runs" / "served-train" / "export" / "export.json").exists()
    assert json.loads((root / "registry" / "served" / "CURRENT.json").read_text())["version"] == "v000001"
    # the promoted model (CURRENT) extracts through the extract deployment
    texts = write_jsonl(root / "texts.jsonl", [{"text": r["input"]} for r in tiny_records(5, seed=7)])
    extract = run_deployment(
        EXTRACT,
        timeout=0,
        parameters={
            "model_name": "served",
            "registry_root": str(root / "registry"),
            "data": texts,
            "out": str(root / "extracted.jsonl"),
            "labels": ["person", "city"],
        },
    )
    state = _wait_final(extract.id)
    assert state.is_completed(), (state, (root / "serve.log").read_text()[-4000:])
    lines = [json.loads(line) for line in (root / "extracted.jsonl").read_text().splitlines()]
    assert [line["line"] for line in lines] == [1, 2, 3, 4, 5] and all("entities" in x["extraction"] for x in lines)


def _wait_final(flow_run_id: Any, timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    with _client() as client:
        while True:
            state = client.read_flow_run(flow_run_id).state
            if (state is not None and state.is_final()) or time.monotonic() > deadline:
                return state
            time.sleep(0.25)
