"""The MLflow mirror against a real ``mlflow server`` (SQLite backend) on loopback: a training run's parameters,
step metrics, validation metrics and exported model (the run's logged pyfunc model, with its thresholds and schema)
land in one MLflow run, a run killed mid-way and resumed continues that run with every step logged once, and the
registry's promotions become MLflow model versions of that logged model with the alias ``champion``, which loads
and extracts as the product's own extraction does. The client side needs only the ``mlflow`` extra
(mlflow-skinny). Without MLflow configured (or installed) nothing is logged and nothing fails."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.model_registry import ModelRegistry, mlflow_sync
from prefect_gliner2.model_registry.mlflow_logged_model import WEIGHTS_TAG, find_logged_model
from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job, run_job
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.session_core.layout import EXPORT_MARKER_FILE
from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES

from support.extra_only import command, site_view
from support.flow import ROOT, TESTS, flow_child, make_space, run_flow, space_params, wait_for_marker
from support.history import recorded_history
from support.mlflow_server import MlflowServer, mlflow_server
from support.processes import kill9
from support.services import free_port

RUN_KEY = "mlflow-crash"


@pytest.fixture(scope="module")
def server() -> Iterator[MlflowServer]:
    with mlflow_server() as started:
        yield started


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_space(tmp_path_factory.mktemp("mlflow"))


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _steps(client: Any, run_id: str, key: str) -> list[int]:
    return sorted(int(m.step) for m in client.get_metric_history(run_id, key))


def test_without_mlflow_configured_or_installed_nothing_is_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert not mlflow_sync.enabled()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("PREFECT_GLINER2_MLFLOW", "0")
    assert not mlflow_sync.enabled()
    monkeypatch.delenv("PREFECT_GLINER2_MLFLOW")
    assert mlflow_sync.enabled()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: `import mlflow` raises ImportError
    assert not mlflow_sync.enabled()


def test_an_unreachable_server_costs_one_warning_never_the_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with caplog.at_level(logging.WARNING, logger=mlflow_sync.__name__):
        run = mlflow_sync.MlflowRun("unreachable", "f" * 64, {"seed": 1})
        run.start([{"step": 1, "loss": 1.0}])
        run.steps([{"step": 2, "loss": 0.5}])
        run.validation({"step": 2, "eval_f1": 0.5})
        run.finish(None, {})
        assert run.close(120), "the mirror's thread must end once its jobs are dropped"
    warnings = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1 and "stopped after an error" in warnings[0], warnings
    assert run.run_id is None


def test_a_crashed_and_resumed_run_is_one_mlflow_run_with_each_step_once_and_promotions_mirrored(
    server: MlflowServer,
    space: dict[str, Any],
    prefect_server: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    env = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "suite"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = _client(server.uri)
    params = space_params(space, RUN_KEY)
    markers = space["root"] / "markers"
    markers.mkdir()
    # paused (then killed) at batch 8, after the checkpoint at batch 7 (step 4) and the epoch-1 validation
    process = flow_child(params, FaultPlan((Fault.pause("batch", 8, 120),), markers=str(markers)), prefect_server, env)
    try:
        wait_for_marker(markers, "batch-8", process, timeout=300)  # importing mlflow: seconds on a busy machine
        deadline = time.monotonic() + 60
        while (found := mlflow_sync.find_run(client, RUN_KEY)) is None or _steps(client, found.info.run_id, "loss") != [
            1,
            2,
            3,
            4,
        ]:
            assert time.monotonic() < deadline, "the running run's steps 1-4 never reached MLflow"
            time.sleep(0.5)
    finally:
        kill9(process)
    crashed = client.get_run(found.info.run_id)
    assert crashed.info.status == "RUNNING" and _steps(client, crashed.info.run_id, "eval_f1") == [3]
    summary = run_flow(**params)

    runs = client.search_runs([client.get_experiment_by_name("suite").experiment_id])
    assert [r.info.run_id for r in runs] == [crashed.info.run_id], "the resumed run continues the same MLflow run"
    run = client.get_run(crashed.info.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == RUN_KEY
    assert run.data.tags[mlflow_sync.FLOW_RUN_TAG] == summary["flow_run_id"]
    assert run.data.params["run_key"] == RUN_KEY and run.data.params["seed"] == "11"
    assert run.data.params["plan_fingerprint"] == summary["fingerprint"]
    newest = sorted((Path(summary["run_dir"]) / "checkpoints").iterdir())[-1]
    train, evaluations = recorded_history(str(newest))
    for key in ("loss", "learning_rate", "grad_norm"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == [e["step"] for e in train] == [1, 2, 3, 4, 5, 6], key  # each once
        assert [m.value for m in history] == pytest.approx([e[key] for e in train], rel=1e-6), key
    assert _steps(client, run.info.run_id, "eval_f1") == _steps(client, run.info.run_id, "eval_loss") == [3, 6]
    labels = {row["label"] for row in evaluations[-1]["per_label"]}
    assert labels and all(f"eval_f1/{label}" in run.data.metrics for label in labels)
    assert all(f"eval_f1_fitted/{label}" in run.data.metrics for label in labels)
    for key in ("eval_f1", "eval_macro_f1", "eval_f1_fitted", "eval_macro_f1_fitted"):
        assert run.data.metrics[key] == pytest.approx(evaluations[-1][key]), key
    model_id = _assert_logged_model(client, run, summary["export"])

    registry = ModelRegistry(str(tmp_path / "registry"), "mlflow-ner")
    first = registry.register(summary["export"], {"run_key": RUN_KEY})
    registry.promote(first.version)
    registry.promote(first.version)  # again: the same MLflow model version, not a new one
    second = registry.register(summary["export"], {"run_key": RUN_KEY})
    registry.promote(second.version)
    versions = sorted(client.search_model_versions("name = 'mlflow-ner'"), key=lambda v: int(v.version))
    assert [v.tags[mlflow_sync.VERSION_TAG] for v in versions] == [first.version, second.version]
    assert all(v.run_id == run.info.run_id for v in versions)
    champion = client.get_model_version_by_alias("mlflow-ner", mlflow_sync.CHAMPION)
    assert champion.tags[mlflow_sync.VERSION_TAG] == second.version
    assert all(v.source == f"models:/{model_id}" for v in versions), "each version is the run's logged model"
    registry.promote(first.version)  # a rollback moves the alias back
    champion = client.get_model_version_by_alias("mlflow-ner", mlflow_sync.CHAMPION)
    assert champion.tags[mlflow_sync.VERSION_TAG] == first.version
    texts = [record["input"] for record in _records(space["inputs"]["valid"])[:2]]
    _assert_extracts_as_the_product(
        _load("models:/mlflow-ner@champion").predict(texts), summary["export"], texts, tmp_path
    )


def _assert_logged_model(client: Any, run: Any, export: str) -> str:
    """The export is the run's one logged model, READY, in its experiment, with the export's files, thresholds,
    schema and weights digest, and the validation metrics of the exported step; returns its id."""
    info = json.loads((Path(export) / EXPORT_MARKER_FILE).read_text())
    [output] = run.outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    assert find_logged_model(client, run.info.experiment_id, run.info.run_id).model_id == model.model_id
    assert (model.source_run_id, model.experiment_id, str(model.status)) == (
        run.info.run_id,
        run.info.experiment_id,
        "READY",
    )
    assert output.step == info["step"] and model.tags[WEIGHTS_TAG] == info["weights_sha256"] and model.name == RUN_KEY
    assert model.params["threshold"] == str(info["thresholds"]["threshold"]) and info["thresholds"]["fitted"]
    per_label = {k: v for k, v in model.params.items() if k.startswith("threshold/")}
    assert per_label == {
        f"threshold/{kind}/{label}": str(value)
        for kind in ("entities", "relations", "fields")
        for label, value in info["thresholds"][kind].items()
    }
    assert json.loads(model.params["schema"]) == info["schema"]
    own = {"threshold", "thresholds_fitted", "schema", "export_step", "export_label", "run_key", "base_model"}
    assert set(model.params) == own | set(per_label) and model.params["base_model"] == run.data.params["model"]
    linked = {m.key: m.value for m in model.metrics}  # the run's metrics at the exported weights' step
    at_step = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval_f1")}
    assert linked["eval_f1"] == at_step[info["step"]] and "loss" in linked, linked
    files = {Path(a.path).name for a in client.list_logged_model_artifacts(model.model_id, "artifacts/export")}
    assert files == {p.name for p in Path(export).iterdir()}, files  # files and folders (encoder_config/)
    return str(model.model_id)


def _load(uri: str) -> Any:
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(uri)


def _records(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _assert_extracts_as_the_product(predictions: Any, export: str, texts: list[str], tmp_path: Path) -> None:
    """`predictions` equal what ``prefect-gliner2 extract`` writes for `texts` with the export (its fitted
    thresholds, its trained schema), and find something."""
    data, out = tmp_path / "texts.jsonl", tmp_path / "extracted.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    run_job(prepare_job(export, str(data), str(out), ExtractSettings()))
    expected = [json.loads(line)["extraction"] for line in out.read_text().splitlines()]
    assert predictions == expected and len(expected) == len(texts) == 2
    assert any(found for result in expected for found in result["entities"].values()), expected


def _tiny_export(space: dict[str, Any], folder: Path) -> Path:
    """The space's tiny model as an export with fitted thresholds and a trained schema."""
    shutil.copytree(space["span"], folder)
    thresholds = {"threshold": 0.3, "entities": {"person": 0.6}, "fitted": True}
    info = {"label": "final", "step": 1, "thresholds": thresholds, "schema": {"entities": list(TINY_ENTITY_TYPES)}}
    (folder / EXPORT_MARKER_FILE).write_text(json.dumps(info))
    return folder


def test_a_model_that_cannot_be_logged_is_a_warning_and_the_run_still_finishes(
    server: MlflowServer,
    space: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prefect_gliner2.runtime.mlflow_model import pyfunc_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "no-pyfunc")
    monkeypatch.setitem(sys.modules, "mlflow.pyfunc", None)  # as when pandas (which it imports) is missing
    with caplog.at_level(logging.WARNING, logger=mlflow_sync.__name__):
        run = mlflow_sync.MlflowRun("no-pyfunc", "f" * 64, {"seed": 1}, pyfunc=pyfunc_model)
        run.start([{"step": 1, "loss": 1.0}])
        run.finish(str(_tiny_export(space, tmp_path / "export")), {"total_steps": 1})
        assert run.close(120)
    [warning] = [r.getMessage() for r in caplog.records if r.name == mlflow_sync.__name__]
    assert "model of run no-pyfunc is not logged" in warning and "prefect-gliner2[mlflow]" in warning, warning
    logged = _client(server.uri).get_run(str(run.run_id))
    assert logged.info.status == "FINISHED" and not logged.outputs.model_outputs


def test_the_mlflow_extra_alone_logs_and_loads_the_model(
    server: MlflowServer, space: dict[str, Any], tmp_path: Path
) -> None:
    """In an interpreter that sees only what ``pip install 'prefect-gliner2[mlflow]'`` installs (mlflow-skinny, not
    the test extra's full mlflow), an export is logged as a run's model and loads and extracts from models:/."""
    export = _tiny_export(space, tmp_path / "export")
    allowed = site_view("mlflow", tmp_path / "site")
    assert "mlflow-skinny" in allowed and not {"mlflow", "flask", "pytest"} & allowed, sorted(allowed)
    texts = [record["input"] for record in _records(space["inputs"]["valid"])[:2]]
    env = dict(os.environ, MLFLOW_TRACKING_URI=server.uri, MLFLOW_EXPERIMENT_NAME="extra", PYTHONPATH=str(TESTS))
    child = command(tmp_path / "site", "support.mlflow_child", "extra-only", str(export), json.dumps(texts))
    done = subprocess.run(child, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    _assert_extracts_as_the_product(result["predictions"], str(export), texts, tmp_path)
