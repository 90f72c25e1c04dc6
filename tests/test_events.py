"""The example automation of deployments/prefect.yaml on a loopback server: a `prefect-gliner2.data.landed` event
creates a run of the retraining deployment with the landed files as its parameters. (The events a training run
emits, across a crash and a resume, are checked in tests/test_ui_state.py.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

from prefect_gliner2.deployments.serve import build_deployments

pytestmark = pytest.mark.usefixtures("prefect_server")


def _runs_of(deployment_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return list(
            client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        )


def test_new_data_runs_the_retraining_deployment(tmp_path: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.events import emit_event

    [retrain] = [d for d in build_deployments() if d.name == "retrain-nightly"]
    with get_client(sync_client=True) as client:  # the shared server may hold this trigger for a deployment
        for name in {trigger.name for trigger in retrain.triggers if trigger.name}:  # another test removed
            for stale in client.read_automations_by_name(name):
                client.delete_automation(stale.id)
    deployment_id = retrain.apply()
    try:
        landed = {"train_data": str(tmp_path / "train-2026-12.jsonl"), "valid_data": str(tmp_path / "valid.jsonl")}
        emit_event(
            event="prefect-gliner2.data.landed",
            resource={"prefect.resource.id": "prefect-gliner2.dataset.ner-news", "prefect.resource.name": "ner-news"},
            payload=landed,
        )
        deadline = time.monotonic() + 90
        while True:
            started = [r for r in _runs_of(deployment_id) if r.parameters.get("train_data") == landed["train_data"]]
            if started or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert started, "the automation did not create a retraining run"
        [run] = started
        assert run.parameters["valid_data"] == landed["valid_data"]
        assert run.parameters["model_name"] == "ner-news"
        assert run.parameters["registry_root"] == "./registry"  # the deployment's other defaults are kept
    finally:
        with get_client(sync_client=True) as client:
            client.delete_resource_owned_automations(f"prefect.deployment.{deployment_id}")
            client.delete_deployment(deployment_id)
