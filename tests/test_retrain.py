"""The scheduled retraining flow: change detection, candidate training from the current model, held-out
comparison, promotion only when better, lineage and an always-valid CURRENT pointer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows import events as flow_events
from prefect_gliner2.flows import retrain
from prefect_gliner2.flows.params import TrainingSettings
from prefect_gliner2.flows.retrain import data_fingerprint, decide, inputs_fingerprint, retrain_flow
from prefect_gliner2.model_registry import ModelRegistry
from prefect_gliner2.runtime.errors import RunConflictError
from prefect_gliner2.session_core.tiny import tiny_records

from support.config import training_config
from support.flow import THREADS, write_jsonl

pytestmark = pytest.mark.usefixtures("prefect_server")

NAME = "ner-tiny"
LINEAGE_KEYS = {
    "base_model",
    "base_model_hash",
    "data_fingerprint",
    "inputs_fingerprint",
    "manifest_fingerprint",
    "plan_fingerprint",
    "run_key",
    "metrics",
    "promoted",
    "reason",
    "init_weights",
    "train_records_sha256",
    "valid_records_sha256",
    "version",
}


def _retrain(root: Path, train: str, valid: str, **overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = dict(
        model_name=NAME,
        train_data=train,
        valid_data=valid,
        registry_root=str(root / "registry"),
        base_model="tiny:span",
        config=training_config(num_epochs=1),
        storage=str(root / "runs"),
        cpu_threads=THREADS,
    )
    params.update(overrides)
    outcome = retrain_flow(**params)
    assert isinstance(outcome, dict), outcome
    _assert_pointer_valid(root)
    return outcome


def _assert_pointer_valid(root: Path) -> None:
    pointer = root / "registry" / NAME / "CURRENT.json"
    if pointer.exists():
        data = json.loads(pointer.read_text())
        assert (root / "registry" / NAME / "versions" / data["version"] / "lineage.json").exists()


def test_decide() -> None:
    from prefect_gliner2.session_core.managed import EVAL_KEYS

    assert retrain.EVAL_KEYS == EVAL_KEYS
    assert decide(1.0, None, greater_is_better=False, margin=5.0)[0]
    assert decide(0.5, 1.0, greater_is_better=False, margin=0.1)[0]
    assert not decide(0.95, 1.0, greater_is_better=False, margin=0.1)[0]
    assert not decide(1.0, 1.0, greater_is_better=False, margin=0.0)[0]
    assert decide(0.9, 0.5, greater_is_better=True, margin=0.1)[0]


def _model_events(emitted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model.* events among everything emitted (the training subflows emit run events too)."""
    return [e for e in emitted if e["event"].startswith("prefect-gliner2.model.")]


def _assert_labels(flow_run_id: str, expected: dict[str, Any]) -> None:
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        labels = client.read_flow_run(UUID(flow_run_id)).labels
    assert {k: labels.get(k) for k in expected} == expected


def test_retraining_lifecycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emitted: list[dict[str, Any]] = []
    monkeypatch.setattr(flow_events, "emit_event", lambda **kw: emitted.append(kw))
    valid = write_jsonl(tmp_path / "valid.jsonl", tiny_records(4, seed=99))
    train = tmp_path / "train.jsonl"
    write_jsonl(train, tiny_records(8, seed=5))
    registry = ModelRegistry(str(tmp_path / "registry"), NAME)

    first = _retrain(tmp_path, str(train), valid)
    assert (first["status"], first["version"], first["current"], first["previous"]) == (
        "promoted",
        "v000001",
        "v000001",
        None,
    )
    v1 = registry.get("v000001")
    assert LINEAGE_KEYS <= set(v1.lineage) and v1.lineage["promoted"] is True and v1.lineage["init_weights"] is None
    assert v1.lineage["data_fingerprint"] == data_fingerprint(str(train), valid)["data_fingerprint"]
    assert set(v1.lineage["metrics"]) == {"candidate"}
    # the held-out score is the training run's own best validation metric (same weights, same batches)
    assert v1.lineage["metrics"]["candidate"]["eval_loss"] == v1.lineage["training"]["best_metric"]
    events = _model_events(emitted)
    assert [e["event"] for e in events] == ["prefect-gliner2.model.promoted"]
    assert events[0]["resource"]["prefect.resource.id"] == f"prefect-gliner2.model.{NAME}"
    assert v1.uri == str(tmp_path / "registry" / NAME / "versions" / "v000001") == events[0]["payload"]["uri"]
    assert events[0]["payload"]["registry"] == str(tmp_path / "registry")
    labels = {"prefect-gliner2.model": NAME, "prefect-gliner2.version": "v000001"}
    _assert_labels(events[0]["payload"]["flow_run_id"], labels)

    started = time.monotonic()
    same = _retrain(tmp_path, str(train), valid)
    assert time.monotonic() - started < 15
    assert (same["status"], same["version"], same["current"]) == ("unchanged", "v000001", "v000001")
    assert [v.version for v in registry.versions()] == ["v000001"]

    write_jsonl(train, tiny_records(8, seed=5) + tiny_records(4, seed=6))
    rejected = _retrain(tmp_path, str(train), valid, margin=1e6)
    assert (rejected["status"], rejected["version"], rejected["current"]) == ("rejected", "v000002", "v000001")
    v2 = registry.get("v000002")
    assert v2.lineage["promoted"] is False and v2.lineage["init_weights"] == "v000001"
    assert v2.lineage["run_key"].endswith("-v000001")
    # the current model scores exactly what it scored as a candidate
    assert v2.lineage["metrics"]["current"]["eval_loss"] == v1.lineage["metrics"]["candidate"]["eval_loss"]
    assert registry.current() is not None and registry.current().version == "v000001"  # type: ignore[union-attr]
    events = _model_events(emitted)
    assert [e["event"] for e in events][1:] == ["prefect-gliner2.model.rejected"]
    assert events[1]["payload"]["uri"] == v2.uri and events[1]["payload"]["previous_uri"] == v1.uri

    # the candidate run records where it started: resuming it with other init_weights is refused
    from prefect_gliner2.flows.train import train_flow

    with pytest.raises(RunConflictError, match="init_weights"):
        train_flow(
            model="tiny:span", run_key=v2.lineage["run_key"], storage=str(tmp_path / "runs"), cpu_threads=THREADS
        )

    write_jsonl(train, tiny_records(8, seed=5) + tiny_records(8, seed=7))
    promoted = _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=2))
    assert (promoted["status"], promoted["version"], promoted["current"], promoted["previous"]) == (
        "promoted",
        "v000003",
        "v000003",
        "v000001",
    )
    scores = promoted["metrics"]
    assert scores["candidate"]["eval_loss"] < scores["current"]["eval_loss"]
    assert json.loads((tmp_path / "registry" / NAME / "CURRENT.json").read_text())["previous"] == "v000001"
    assert [(e["event"].rsplit(".", 1)[-1], e["resource"]["version"]) for e in _model_events(emitted)] == [
        ("promoted", "v000001"),
        ("rejected", "v000002"),
        ("promoted", "v000003"),
    ]

    # same data, other training settings: a new candidate (never a conflict with the earlier run key)
    assert _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=2))["status"] == "unchanged"
    settings = _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=1), margin=1e6)
    assert (settings["status"], settings["version"], settings["current"]) == ("rejected", "v000004", "v000003")
    v4 = registry.get("v000004")
    assert v4.lineage["data_fingerprint"] == registry.get("v000003").lineage["data_fingerprint"]
    assert v4.lineage["inputs_fingerprint"] != registry.get("v000003").lineage["inputs_fingerprint"]


def test_a_relative_registry_root_is_stored_and_reported_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_gliner2.session_core.tiny import save_tiny_model

    monkeypatch.chdir(tmp_path)
    save_tiny_model(tmp_path / "model", "span", seed=3)
    registry = ModelRegistry("./registry", NAME)
    version = registry.register("./model", {"promoted": True})
    assert version.uri == str(tmp_path / "registry" / NAME / "versions" / "v000001")
    assert version.lineage["source"] == str(tmp_path / "model")
    assert registry.promote("v000001").uri == version.uri


def test_unchanged_data_completes_an_interrupted_promotion(tmp_path: Path) -> None:
    """A run that registered a promoted candidate but died before moving CURRENT: the next run finishes the job."""
    valid = write_jsonl(tmp_path / "valid.jsonl", tiny_records(3, seed=1))
    train = write_jsonl(tmp_path / "train.jsonl", tiny_records(3, seed=2))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    registry = ModelRegistry(str(tmp_path / "registry"), NAME)
    data = data_fingerprint(train, valid)
    training = TrainingSettings.model_validate(training_config(num_epochs=1)).to_training_config()
    inputs = inputs_fingerprint(data, training, "tiny:span")
    registry.register(str(model), {**data, "inputs_fingerprint": inputs, "promoted": True})
    assert registry.current() is None
    outcome = _retrain(tmp_path, train, valid)
    assert (outcome["status"], outcome["current"]) == ("promoted", "v000001")
    assert registry.current() is not None and registry.current().version == "v000001"  # type: ignore[union-attr]
