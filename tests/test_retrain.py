"""The scheduled retraining flow: change detection, candidate training from the current model, held-out
comparison, promotion only when better, lineage and an always-valid CURRENT pointer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows import events as flow_events
from prefect_gliner2.flows.params import TrainingSettings
from prefect_gliner2.flows.retrain import data_fingerprint, inputs_fingerprint, retrain_flow
from prefect_gliner2.model_registry import ModelRegistry
from prefect_gliner2.runtime.errors import RunConflictError
from prefect_gliner2.training.tiny import tiny_records

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
    "decision",
    "weights_sha256",
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
    from prefect_gliner2.tasks import promotion

    emitted: list[dict[str, Any]] = []
    monkeypatch.setattr(flow_events, "emit_event", lambda **kw: emitted.append(kw))
    children: list[Any] = []  # every candidate is scored in its own session worker: no scoring process is spawned
    monkeypatch.setattr(promotion, "score_in_child", lambda *args: children.append(args))
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
    assert set(v1.lineage["metrics"]) == {"candidate", "base"}  # the base model's score sits beside
    # the held-out score uses the thresholds fitted at export on the same records: it is the fitted F1, and the F1
    # those thresholds replace (at 0.5) is the training run's own best validation metric (same weights, batches)
    candidate = v1.lineage["metrics"]["candidate"]
    assert candidate["thresholds_from"] == "recorded" and v1.lineage["thresholds"] == candidate["thresholds"]
    assert candidate["eval_f1"] == candidate["thresholds"]["details"]["f1"]
    details, training = candidate["thresholds"]["details"], v1.lineage["training"]
    assert training["metric_for_best"] == "eval_f1_fitted" and training["best_metric"] is not None
    assert details["f1"] >= details["f1_default"]  # the fit never ships values worse than 0.5 on its own records
    assert v1.lineage["comparison_data"] == "valid_data" and v1.lineage["comparison_records"] == 4
    assert first["reason"].startswith("there is no current model: the first candidate is promoted")
    assert first["reason"].endswith("(valid_data also selected the candidate's best checkpoint)")
    assert v1.lineage["decision"]["verdict"] == "promoted" and v1.lineage["decision"]["test"]["records"] == 4
    events = _model_events(emitted)
    assert [e["event"] for e in events] == ["prefect-gliner2.model.promoted"]
    assert events[0]["resource"]["prefect.resource.id"] == f"prefect-gliner2.model.{NAME}"
    assert v1.uri == str(tmp_path / "registry" / NAME / "versions" / "v000001") == events[0]["payload"]["uri"]
    assert events[0]["payload"]["registry"] == str(tmp_path / "registry")
    assert events[0]["payload"]["decision"] == v1.lineage["decision"]
    labels = {"prefect-gliner2.model": NAME, "prefect-gliner2.version": "v000001"}
    _assert_labels(events[0]["payload"]["flow_run_id"], labels)

    started = time.monotonic()
    same = _retrain(tmp_path, str(train), valid)
    assert time.monotonic() - started < 15
    assert (same["status"], same["version"], same["current"]) == ("unchanged", "v000001", "v000001")
    assert [v.version for v in registry.versions()] == ["v000001"]

    write_jsonl(train, tiny_records(8, seed=5) + tiny_records(4, seed=6))
    guard = write_jsonl(tmp_path / "guard.jsonl", tiny_records(5, seed=8))
    rejected = _retrain(tmp_path, str(train), valid, promotion={"margin": 0.9}, guard_data=guard)
    assert (rejected["status"], rejected["version"], rejected["current"]) == ("rejected", "v000002", "v000001")
    v2 = registry.get("v000002")
    assert v2.lineage["promoted"] is False and v2.lineage["init_weights"] == "v000001"
    assert v2.lineage["run_key"].endswith("-v000001")
    # the current model scores exactly what it scored as a candidate: the same counts, the same interval
    assert v2.lineage["decision"]["test"]["current"] == v1.lineage["decision"]["test"]["candidate"]
    assert v2.lineage["metrics"]["current"]["per_label"] == v1.lineage["metrics"]["candidate"]["per_label"]
    assert "is not above the margin 0.9" in v2.lineage["reason"] == rejected["reason"]
    assert v2.lineage["decision"]["guard"]["records"] == 5 and v2.lineage["decision"]["guard"]["base"] is not None
    assert set(v2.lineage["guard_metrics"]) == {"candidate", "current", "base"}
    assert v2.lineage["guard_records_sha256"] == data_fingerprint(guard, guard)["train_records_sha256"]
    assert _retrain_markdown().startswith(f"# Retraining {NAME}: candidate v000002 against current v000001")
    assert registry.current() is not None and registry.current().version == "v000001"  # type: ignore[union-attr]
    events = _model_events(emitted)
    assert [e["event"] for e in events][1:] == ["prefect-gliner2.model.rejected"]
    assert events[1]["payload"]["uri"] == v2.uri and events[1]["payload"]["previous_uri"] == v1.uri
    assert events[1]["payload"]["decision"] == v2.lineage["decision"]

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
    # a permissive rule (not worse by 0.9 F1, labels not judged): these tiny models extract next to nothing, and at
    # their fitted thresholds a label the current model finds once may vanish
    tolerant = {"margin": -0.9, "max_label_drop": 1.0, "min_vanish_support": 1_000_000}
    promoted = _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=2), promotion=tolerant)
    assert (promoted["status"], promoted["version"], promoted["current"], promoted["previous"]) == (
        "promoted",
        "v000003",
        "v000003",
        "v000001",
    )
    assert promoted["decision"]["rule"]["margin"] == -0.9 and promoted["decision"]["test"]["difference"]["low"] > -0.9
    assert json.loads((tmp_path / "registry" / NAME / "CURRENT.json").read_text())["previous"] == "v000001"
    assert [(e["event"].rsplit(".", 1)[-1], e["resource"]["version"]) for e in _model_events(emitted)] == [
        ("promoted", "v000001"),
        ("rejected", "v000002"),
        ("promoted", "v000003"),
    ]

    # same data, other training settings: a new candidate (never a conflict with the earlier run key)
    assert _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=2))["status"] == "unchanged"
    settings = _retrain(tmp_path, str(train), valid, config=training_config(num_epochs=1), promotion={"margin": 0.9})
    assert (settings["status"], settings["version"], settings["current"]) == ("rejected", "v000004", "v000003")
    v4 = registry.get("v000004")
    assert v4.lineage["data_fingerprint"] == registry.get("v000003").lineage["data_fingerprint"]
    assert v4.lineage["inputs_fingerprint"] != registry.get("v000003").lineage["inputs_fingerprint"]
    assert children == []


def _retrain_markdown() -> str:
    """The newest retraining decision artifact's markdown."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        [artifact] = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"gliner2-model-{NAME}-retrain"]))
        )
    return str(artifact.data)


def test_a_relative_registry_root_is_stored_and_reported_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_gliner2.training.tiny import save_tiny_model

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


def test_promotion_follows_extraction_f1_beyond_noise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that extracts; two retrains in a row on data that does not change its quality leave CURRENT alone:
    the point F1 moves, the interval says it may be noise (``tests/test_promotion.py`` shows a gain by noise rejected
    on hand-made counts). The current model scores what it scored as a candidate; ``compare`` agrees with the flow."""
    monkeypatch.setattr(flow_events, "emit_event", lambda **kw: None)
    valid = write_jsonl(tmp_path / "valid.jsonl", tiny_records(16, seed=99))
    test = write_jsonl(tmp_path / "test.jsonl", tiny_records(24, seed=98))
    no_augmentation = {
        "shuffle_entity_labels": False,
        "negative_label_prob": 0.0,
        "synthetic_entity_label_prob": 0.0,
        "label_subset_prob": 0.0,
    }
    learns = training_config(
        batch_size=8, gradient_accumulation_steps=1, num_epochs=24, encoder_lr=5e-3, task_lr=2e-2, **no_augmentation
    )
    registry = ModelRegistry(str(tmp_path / "registry"), NAME)

    def run(train: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
        path = write_jsonl(tmp_path / f"train-{len(registry.versions())}.jsonl", train)
        return _retrain(tmp_path, path, valid, **{"config": learns, "test_data": test, **overrides})

    first = run(tiny_records(96, seed=1))  # 288 updates: it extracts, and more of the same no longer helps
    v1 = registry.get(first["version"])
    assert first["status"] == "promoted" and v1.lineage["comparison_data"] == "test_data"
    scores = v1.lineage["metrics"]
    assert scores["candidate"]["eval_f1"] > scores["base"]["eval_f1"] and scores["candidate"]["examples"] == 24

    same_quality = {**learns, "num_epochs": 1, "encoder_lr": 5e-4, "task_lr": 2e-3}
    for seed in (10, 11):  # more records of the same kind, one gentle epoch from the current model
        outcome = run(tiny_records(24, seed=seed), config=same_quality)
        assert (outcome["status"], outcome["current"]) == ("rejected", first["version"]), outcome["reason"]
        difference = outcome["decision"]["test"]["difference"]
        assert difference["estimate"] != 0.0 and difference["low"] <= 0.0  # the point F1 moved; not beyond noise
        assert "test_data (24 records)" in outcome["reason"]
        assert outcome["decision"]["test"]["current"] == v1.lineage["decision"]["test"]["candidate"]

    # `prefect-gliner2 compare` on the registered versions makes the flow's decision, number for number
    from prefect_gliner2.flows.cli import main

    v2, out = registry.get("v000002"), tmp_path / "compare.json"
    argv = ["compare", "--a", v1.uri, "--b", v2.uri, "--data", test, "--base", "tiny:span", "--json", str(out)]
    assert main([*argv, "--seed", str(learns["seed"])]) == 0
    by_hand, in_flow = json.loads(out.read_text())["decision"], v2.lineage["decision"]
    for key in ("candidate", "current", "base", "difference", "labels"):
        assert by_hand["test"][key] == in_flow["test"][key], key
    assert by_hand["verdict"] == in_flow["verdict"] == "rejected"

    # the flow scored in the candidate's session worker, after its training; a fresh process (where a retrain whose
    # candidate run was found complete scores) gives the same numbers, bit for bit
    from prefect_gliner2.runtime.compare import metrics_only
    from prefect_gliner2.tasks.promotion import score_in_child

    metrics = v2.lineage["metrics"]
    models = {"candidate": metrics["candidate"]["uri"], "current": metrics["current"]["uri"], "base": None}
    fresh = score_in_child(models, "tiny:span", {"test_data": test}, v2.lineage["config"], THREADS)
    assert metrics_only(fresh["test_data"]) == metrics


def test_a_comparison_set_too_small_to_resample_is_refused_before_training(tmp_path: Path) -> None:
    from prefect_gliner2.session_core.errors import ConfigError

    valid = write_jsonl(tmp_path / "valid.jsonl", tiny_records(3, seed=1))
    train = write_jsonl(tmp_path / "train.jsonl", tiny_records(3, seed=2))
    one = write_jsonl(tmp_path / "one.jsonl", tiny_records(1, seed=3))
    for where in ({"test_data": one}, {"guard_data": one}):
        with pytest.raises(ConfigError, match="has 1 record\\(s\\); the promotion decision resamples records"):
            _retrain(tmp_path, train, valid, **where)
    assert not (tmp_path / "runs").exists() and ModelRegistry(str(tmp_path / "registry"), NAME).versions() == []
