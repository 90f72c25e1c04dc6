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
        execution={"cpu_threads": THREADS},
        metric="eval_loss",  # tiny models trained this briefly extract nothing: F1 is 0 for every version
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
    from prefect_gliner2.session_core.metrics import EVAL_KEYS

    assert retrain.EVAL_KEYS is EVAL_KEYS  # one list of metric names
    loss = {"eval_loss": 1.0, "eval_f1": 0.5}
    assert decide({"eval_loss": 1.0, "eval_f1": 0.1}, None, metric="eval_loss", greater_is_better=False, margin=5.0)[0]
    assert decide({"eval_loss": 0.5, "eval_f1": 0.5}, loss, metric="eval_loss", greater_is_better=False, margin=0.1)[0]
    assert not decide(
        {"eval_loss": 0.95, "eval_f1": 0.5}, loss, metric="eval_loss", greater_is_better=False, margin=0.1
    )[0]
    assert not decide({"eval_loss": 1.0, "eval_f1": 0.5}, loss, metric="eval_loss", greater_is_better=False)[0]
    better, reason = decide({"eval_f1": 0.9}, {"eval_f1": 0.5}, margin=0.1, data="test_data (8 records)")
    assert better and reason == (
        "candidate F1 0.9000, current model F1 0.5000, on test_data (8 records): "
        "the candidate's eval_f1 is more than 0.1 above the current model's"
    )
    assert not decide({"eval_f1": 0.5}, {"eval_f1": 0.9})[0]
    # a candidate extracting nothing correct never replaces one that does, even when its loss is lower
    zero, why = decide({"eval_loss": 0.1, "eval_f1": 0.0}, loss, metric="eval_loss", greater_is_better=False)
    assert not zero and "F1 0.0000" in why and "F1 0.5000" in why and "never replaces" in why
    assert not decide({"eval_f1": 0.0}, {"eval_f1": 0.0})[0]  # no better: nothing to promote


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
    # the held-out score uses the thresholds fitted at export on the same records: it is the fitted F1, and the F1
    # those thresholds replace (at 0.5) is the training run's own best validation metric (same weights, batches)
    # (training selects by eval_f1, the default; the comparison here uses eval_loss)
    candidate = v1.lineage["metrics"]["candidate"]
    assert candidate["threshold_source"] == "fitted" and v1.lineage["thresholds"] == candidate["thresholds"]
    assert candidate["eval_f1"] == candidate["thresholds"]["details"]["f1"]
    assert candidate["thresholds"]["details"]["f1_default"] == v1.lineage["training"]["best_metric"]
    assert v1.lineage["comparison_data"] == "valid_data" and v1.lineage["comparison_records"] == 4
    assert "on valid_data (4 records, the data that also selected the candidate's best checkpoint)" in first["reason"]
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
            model="tiny:span",
            run_key=v2.lineage["run_key"],
            storage=str(tmp_path / "runs"),
            execution={"cpu_threads": THREADS},
        )

    write_jsonl(train, tiny_records(8, seed=5) + tiny_records(8, seed=7))
    # compared by eval_loss alone: at their fitted thresholds these tiny models extract junk (v000001 scores F1 0.05,
    # this candidate 0), and a candidate with F1 0 never replaces one without; losses only leaves F1 out of it
    losses_only = training_config(num_epochs=2, eval_extraction=False)
    promoted = _retrain(tmp_path, str(train), valid, config=losses_only)
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
    assert _retrain(tmp_path, str(train), valid, config=losses_only)["status"] == "unchanged"
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


def _swapped(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bad training data: people labelled as cities and cities as people (labels kept in their usual order)."""
    swap = {"person": "city", "city": "person"}
    out = []
    for record in records:
        entities = record["output"]["entities"]
        swapped = {label: entities.get(swap.get(label, label)) for label in ("person", "city", "company", "day")}
        out.append({"input": record["input"], "output": {"entities": {k: v for k, v in swapped.items() if v}}})
    return out


def test_promotion_follows_extraction_f1_on_test_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate with better F1 is promoted, a worse one is not; the decision names both F1s and the data."""
    monkeypatch.setattr(flow_events, "emit_event", lambda **kw: None)
    valid = write_jsonl(tmp_path / "valid.jsonl", tiny_records(16, seed=99))
    test = write_jsonl(tmp_path / "test.jsonl", tiny_records(16, seed=98))
    learns = training_config(batch_size=8, gradient_accumulation_steps=1, num_epochs=12, encoder_lr=5e-3, task_lr=2e-2)
    registry = ModelRegistry(str(tmp_path / "registry"), NAME)

    def run(train: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
        path = write_jsonl(tmp_path / f"train-{len(registry.versions())}.jsonl", train)
        params = {"metric": "eval_f1", "config": learns, "test_data": test, **overrides}
        return _retrain(tmp_path, path, valid, **params)

    first = run(tiny_records(96, seed=1))
    v1 = registry.get(first["version"])
    assert first["status"] == "promoted" and v1.lineage["comparison_data"] == "test_data"
    assert v1.lineage["metrics"]["candidate"]["eval_f1"] > 0.0  # it extracts
    assert v1.lineage["metrics"]["candidate"]["examples"] == 16

    worse = run(_swapped(tiny_records(64, seed=2)), config={**learns, "num_epochs": 10})
    scores = worse["metrics"]
    assert scores["candidate"]["eval_f1"] < scores["current"]["eval_f1"]
    assert (worse["status"], worse["current"]) == ("rejected", first["version"])
    for value in (scores["candidate"]["eval_f1"], scores["current"]["eval_f1"]):
        assert f"F1 {value:.4f}" in worse["reason"]
    assert "on test_data (16 records)" in worse["reason"]
    assert scores["current"]["eval_f1"] == v1.lineage["metrics"]["candidate"]["eval_f1"]  # same data, same score

    better = run(tiny_records(160, seed=3))
    scores = better["metrics"]
    assert scores["candidate"]["eval_f1"] > scores["current"]["eval_f1"] > 0.0
    assert (better["status"], better["current"], better["previous"]) == ("promoted", better["version"], "v000001")
    assert f"F1 {scores['candidate']['eval_f1']:.4f}" in better["reason"] and "test_data" in better["reason"]
