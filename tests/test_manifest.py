"""Manifests: content, content address, round trips (dict, file, fsspec URL) and rejection of edited manifests."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
from typing import Any

import fsspec
import pytest

from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ManifestError, PlanMismatchError, RecordError
from prefect_gliner2.session_core.manifest import (
    MANIFEST_SCHEMA_NAME,
    MANIFEST_SCHEMA_VERSION,
    LoadedManifest,
    content_address,
    dumps_manifest,
    read_manifest,
    write_manifest,
)
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
from prefect_gliner2.session_core.records import load_records


def _records(n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "input": f"Person {i} named John met Mary in Paris." + " again" * (i % 3),
            "output": {"entities": {"person": ["John", "Mary"], "city": ["Paris"]}},
        }
        for i in range(offset, offset + n)
    ]


def _plan(architecture: str = "boundary", **changes: Any) -> ManagedTrainingPlan:
    cfg = TrainingConfig(
        **{"fp16": False, "bf16": False, "batch_size": 2, "gradient_accumulation_steps": 3, "num_epochs": 2, **changes}
    )
    return ManagedTrainingPlan(_records(7), cfg, architecture=architecture)


def _readdress(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["content_address"] = content_address(manifest)
    return manifest


def test_manifest_content() -> None:
    plan = _plan(eval_strategy="steps", eval_steps=2)
    manifest = plan.to_manifest(eval_examples=_records(2, offset=100))
    assert manifest["schema"] == {"name": MANIFEST_SCHEMA_NAME, "version": MANIFEST_SCHEMA_VERSION}
    assert manifest["plan_algorithm_version"] == 3 and manifest["architecture"] == "boundary"
    assert manifest["config"] == plan.config.to_dict() and manifest["fingerprint"] == plan.fingerprint
    assert manifest["batches"] == [list(plan.rows(i)) for i in range(plan.batch_count)]
    assert (
        manifest["updates"] == [2, 3, 6, 7] and manifest["epoch_ends"] == [3, 7] and manifest["validations"] == [3, 7]
    )
    assert (manifest["max_steps"], manifest["num_epochs"], manifest["batch_count"], manifest["record_count"]) == (
        4,
        2,
        8,
        7,
    )
    assert manifest["selection"] == plan.selection.to_dict()
    assert manifest["examples"] == _records(7)
    assert [json.dumps(r) for r in manifest["examples"]] == [json.dumps(r) for r in _records(7)]  # key order kept
    assert manifest["eval_examples"] == _records(2, offset=100)
    assert json.loads(json.dumps(manifest)) == manifest


def test_content_address_is_sha256_of_everything_else() -> None:
    manifest = _plan().to_manifest()
    rest = {k: v for k, v in manifest.items() if k != "content_address"}
    compact: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False}
    # sorted keys everywhere, except inside the records, whose key order is data
    parts = {k: json.dumps(v, **compact, sort_keys=k not in ("examples", "eval_examples")) for k, v in rest.items()}
    joined = "{" + ",".join(f"{json.dumps(k)}:{parts[k]}" for k in sorted(parts)) + "}"
    expected = hashlib.sha256(joined.encode()).hexdigest()
    assert manifest["content_address"] == expected == content_address(manifest)
    assert manifest["eval_examples"] == []


def test_manifest_bytes_equal_the_serialized_dict() -> None:
    plan = _plan()
    evals = _records(3, offset=50)
    assert plan.manifest_bytes(evals) == dumps_manifest(plan.to_manifest(evals))
    assert plan.manifest_bytes().endswith(b"}\n")


def _assert_same_plan(loaded: ManagedTrainingPlan, plan: ManagedTrainingPlan) -> None:
    assert loaded.fingerprint == plan.fingerprint and loaded.batch_count == plan.batch_count
    assert all(loaded.batch(i) == plan.batch(i) for i in range(plan.batch_count))
    assert loaded.config == plan.config and loaded.architecture == plan.architecture


@pytest.mark.parametrize("architecture", ["span", "boundary"])
def test_round_trip_from_dict(architecture: str) -> None:
    plan = _plan(architecture, max_steps=3)
    evals = _records(2, offset=10)
    loaded = ManagedTrainingPlan.from_manifest(plan.to_manifest(eval_examples=evals))
    assert isinstance(loaded, LoadedManifest)
    _assert_same_plan(loaded.plan, plan)
    assert loaded.eval_records == load_records(evals) and loaded.eval_examples == evals
    again, eval_records = loaded
    assert again is loaded.plan and eval_records is loaded.eval_records
    assert loaded.content_address == plan.to_manifest(eval_examples=evals)["content_address"]
    rows = loaded.plan.batch(0).examples  # key order inside records survives the round trip (it is data)
    assert [json.dumps(r) for r in rows] == [json.dumps(r) for r in plan.batch(0).examples]
    assert [list(r) for r in rows] == [list(_records(7)[i]) for i in loaded.plan.rows(0)]
    assert [json.dumps(r) for r in loaded.eval_examples] == [json.dumps(r) for r in evals]


def test_round_trip_through_a_local_file_is_owner_only_and_atomic(tmp_path: os.PathLike) -> None:
    plan = _plan()
    target = os.path.join(tmp_path, "nested", "plan.manifest.json")
    assert write_manifest(plan.to_manifest(), target) == target
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert os.listdir(os.path.dirname(target)) == ["plan.manifest.json"]  # no temporary file left behind
    with open(target, "rb") as handle:
        assert handle.read() == plan.manifest_bytes()
    loaded_plan, evals = ManagedTrainingPlan.from_manifest(target)
    _assert_same_plan(loaded_plan, plan)
    assert len(evals) == 0
    write_manifest(plan.manifest_bytes(_records(1)), target)  # overwrite with streamed bytes
    assert (
        len(ManagedTrainingPlan.from_manifest(target).eval_records) == 1
        and stat.S_IMODE(os.stat(target).st_mode) == 0o600
    )


def test_round_trip_through_an_fsspec_url() -> None:
    plan = _plan()
    uri = "memory://manifests/run-1/plan.json"
    write_manifest(plan.to_manifest(), uri)
    assert read_manifest(uri) == plan.to_manifest()
    assert [p for p in fsspec.filesystem("memory").ls("/manifests/run-1", detail=False)] == [
        "/manifests/run-1/plan.json"
    ]
    _assert_same_plan(ManagedTrainingPlan.from_manifest(uri).plan, plan)


def test_edited_row_index_is_rejected() -> None:
    manifest = _plan().to_manifest()
    edited = copy.deepcopy(manifest)
    edited["batches"][0][0] = (edited["batches"][0][0] + 1) % 7
    with pytest.raises(ManifestError, match="content address does not match") as info:
        ManagedTrainingPlan.from_manifest(edited)
    assert "must not be edited" in str(info.value) and "regenerate it from the data" in str(info.value)


def test_edited_example_text_is_rejected(tmp_path: os.PathLike) -> None:
    manifest = _plan().to_manifest()
    manifest["examples"][2]["input"] = manifest["examples"][2]["input"].replace("Paris", "Rome")
    with pytest.raises(ManifestError, match="content address does not match"):
        ManagedTrainingPlan.from_manifest(manifest)
    with pytest.raises(ManifestError, match="refusing to write a manifest whose content address does not match"):
        write_manifest(manifest, os.path.join(tmp_path, "m.json"))
    assert not os.listdir(tmp_path)


def test_edited_file_is_rejected(tmp_path: os.PathLike) -> None:
    target = os.path.join(tmp_path, "m.json")
    write_manifest(_plan().to_manifest(), target)
    with open(target, encoding="utf-8") as handle:
        text = handle.read()
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text.replace('"max_steps":4', '"max_steps":5'))
    with pytest.raises(ManifestError, match="content address does not match"):
        ManagedTrainingPlan.from_manifest(target)


def test_readdressed_edits_still_fail_the_rebuild() -> None:
    manifest = _plan().to_manifest()
    swapped = copy.deepcopy(manifest)
    swapped["batches"][0], swapped["batches"][1] = swapped["batches"][1], swapped["batches"][0]
    with pytest.raises(PlanMismatchError, match=r"\['batches'\] differ from the plan rebuilt"):
        ManagedTrainingPlan.from_manifest(_readdress(swapped))
    other_data = copy.deepcopy(manifest)
    other_data["examples"][0]["input"] += " Later."
    with pytest.raises(PlanMismatchError, match="fingerprint"):
        ManagedTrainingPlan.from_manifest(_readdress(other_data))
    bad_example = copy.deepcopy(manifest)
    bad_example["examples"][0]["output"]["entities"]["person"] = ["Nobody"]
    with pytest.raises(ManifestError, match=r"(?s)manifest content is invalid: .*row 0: entity 'Nobody'"):
        ManagedTrainingPlan.from_manifest(_readdress(bad_example))


def test_unknown_schema_versions_and_names_are_rejected() -> None:
    manifest = _plan().to_manifest()
    newer = _readdress({**manifest, "schema": {"name": MANIFEST_SCHEMA_NAME, "version": MANIFEST_SCHEMA_VERSION + 1}})
    with pytest.raises(
        ManifestError,
        match=f"schema version {MANIFEST_SCHEMA_VERSION + 1} is newer than this prefect-gliner2 supports .*upgrade",
    ):
        ManagedTrainingPlan.from_manifest(newer)
    with pytest.raises(ManifestError, match="schema version 0 is not a known version"):
        ManagedTrainingPlan.from_manifest({**manifest, "schema": {"name": MANIFEST_SCHEMA_NAME, "version": 0}})
    with pytest.raises(ManifestError, match="not a training-plan manifest"):
        ManagedTrainingPlan.from_manifest({**manifest, "schema": {"name": "other", "version": 1}})
    old = _readdress({**manifest, "schema": {"name": MANIFEST_SCHEMA_NAME, "version": 1}})
    with pytest.raises(
        ManifestError,
        match="version 1 is no longer supported: version 1 sorted the keys inside each record.*regenerate",
    ):
        ManagedTrainingPlan.from_manifest(old)
    with pytest.raises(ManifestError, match="plan algorithm v9"):
        ManagedTrainingPlan.from_manifest(_readdress({**manifest, "plan_algorithm_version": 9}))


def test_missing_and_unknown_keys_are_rejected() -> None:
    manifest = _plan().to_manifest()
    with pytest.raises(ManifestError, match=r"manifest is missing \['updates'\]"):
        ManagedTrainingPlan.from_manifest({k: v for k, v in manifest.items() if k != "updates"})
    with pytest.raises(ManifestError, match=r"unknown keys \['note'\]"):
        ManagedTrainingPlan.from_manifest(_readdress({**manifest, "note": "hi"}))
    with pytest.raises(ManifestError, match="needs a manifest dict or a path"):
        ManagedTrainingPlan.from_manifest(42)  # type: ignore[arg-type]


def test_corrupt_files_are_manifest_errors(tmp_path: os.PathLike) -> None:
    truncated = os.path.join(tmp_path, "t.json")
    with open(truncated, "wb") as handle:
        handle.write(_plan().manifest_bytes()[:100])
    with pytest.raises(ManifestError, match="not valid UTF-8 JSON"):
        read_manifest(truncated)
    listy = os.path.join(tmp_path, "l.json")
    with open(listy, "w") as handle:
        handle.write("[1, 2]")
    with pytest.raises(ManifestError, match="must hold a JSON object"):
        read_manifest(listy)
    with pytest.raises(ManifestError, match="has no content_address"):
        write_manifest({"schema": {}}, os.path.join(tmp_path, "x.json"))


def test_invalid_eval_examples_are_refused() -> None:
    with pytest.raises(RecordError, match="1 of 1 validation records are invalid"):
        _plan().to_manifest(eval_examples=[{"input": "Hi", "output": {"entities": {"p": ["Zed"]}}}])
