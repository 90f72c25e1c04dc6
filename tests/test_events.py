"""The example automation of deployments/prefect.yaml on a loopback server: a `prefect-gliner2.data.landed` event
creates a run of the retraining deployment with the landed files as its parameters. (The events a training run
emits, across a crash and a resume, are checked in tests/test_ui_state.py.)

The check runs in a fresh interpreter with its own throwaway server: the event pipeline of the suite's shared
server has carried every earlier test's events and automations by the time this runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.flow import ROOT, TESTS

_CHILD = r"""
import json, sys, time
from support.prefect_harness import local_prefect_server

with local_prefect_server():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.events import emit_event
    from prefect_gliner2.deployments.serve import build_deployments

    [retrain] = [d for d in build_deployments() if d.name == "retrain-nightly"]
    deployment_id = retrain.apply()
    landed = json.loads(sys.argv[1])
    emit_event(
        event="prefect-gliner2.data.landed",
        resource={"prefect.resource.id": "prefect-gliner2.dataset.ner-news", "prefect.resource.name": "ner-news"},
        payload=landed,
    )
    deadline, started = time.monotonic() + 90, []
    while not started and time.monotonic() < deadline:
        time.sleep(1)
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
        started = [r.parameters for r in runs if r.parameters.get("train_data") == landed["train_data"]]
    print("RESULT " + json.dumps(started))
"""


def test_new_data_runs_the_retraining_deployment(tmp_path: Path) -> None:
    landed = {"train_data": str(tmp_path / "train-2026-12.jsonl"), "valid_data": str(tmp_path / "valid.jsonl")}
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]),
        PREFECT_HOME=str(tmp_path / "prefect-home"),
    )
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(landed)],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    started = json.loads(lines[-1][len("RESULT ") :])
    assert started, "the automation did not create a retraining run:\n" + done.stderr[-3000:]
    [parameters] = started
    assert parameters["valid_data"] == landed["valid_data"]
    assert parameters["model_name"] == "ner-news"
    assert parameters["registry_root"] == "./registry"  # the deployment's other defaults are kept
