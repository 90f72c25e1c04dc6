"""The model registry: versions, atomic pointer, lineage, rollback, incomplete versions invisible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefect_gliner2.model_registry import ModelRegistry, RegistryError


def model_dir(path: Path, marker: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architecture": "span", "marker": marker}))
    (path / "model.safetensors").write_bytes(marker.encode() * 10)
    (path / "adapter").mkdir()
    (path / "adapter" / "adapter_config.json").write_text("{}")
    return path


@pytest.mark.parametrize("storage", ["local", "memory"])
def test_register_promote_rollback(tmp_path, storage):
    root = str(tmp_path / "registry") if storage == "local" else f"memory://registry-{tmp_path.name}"
    registry = ModelRegistry(root, "ner")
    assert registry.current() is None and registry.latest() is None
    first = registry.register(str(model_dir(tmp_path / "a", "a")), {"data_fingerprint": "d1", "run_key": "r1"})
    second = registry.register(str(model_dir(tmp_path / "b", "b")), {"data_fingerprint": "d2", "run_key": "r2"})
    assert [v.version for v in registry.versions()] == ["v000001", "v000002"]
    assert registry.latest().lineage["data_fingerprint"] == "d2"
    assert registry.current() is None  # registering does not promote
    registry.promote(first.version)
    assert registry.current().version == "v000001"
    registry.promote(second.version)
    assert registry.current().version == "v000002"
    registry.promote("v000001")  # rollback is moving the pointer
    assert registry.current().version == "v000001"
    import fsspec

    fs, path = fsspec.core.url_to_fs(second.uri)
    assert fs.cat_file(f"{path}/model.safetensors") == b"b" * 10
    assert fs.exists(f"{path}/adapter/adapter_config.json")
    assert second.lineage["run_key"] == "r2" and second.lineage["version"] == "v000002"


def test_incomplete_versions_are_invisible_and_pointer_debris_is_harmless(tmp_path):
    registry = ModelRegistry(str(tmp_path), "ner")
    registry.register(str(model_dir(tmp_path / "a", "a")), {"data_fingerprint": "d1"})
    registry.promote("v000001")
    # a crash mid-registration leaves a version directory without lineage.json; a crash mid-promotion leaves a temp
    (tmp_path / "ner" / "versions" / "v000002").mkdir()
    (tmp_path / "ner" / "versions" / "v000002" / "config.json").write_text("{}")
    (tmp_path / "ner" / ".CURRENT.json.dead.tmp").write_text('{"version": "v0000')
    assert [v.version for v in registry.versions()] == ["v000001"]
    assert registry.current().version == "v000001"
    third = registry.register(str(model_dir(tmp_path / "c", "c")), {"data_fingerprint": "d3"})
    assert third.version == "v000003"  # never reuses a claimed number
    with pytest.raises(RegistryError, match="no complete version v000002"):
        registry.promote("v000002")
    assert registry.current().version == "v000001"


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", "x" * 200])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(RegistryError, match="model name"):
        ModelRegistry(str(tmp_path), name)


def test_register_refuses_a_non_model_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RegistryError, match="config.json"):
        ModelRegistry(str(tmp_path / "reg"), "ner").register(str(tmp_path / "empty"), {})


def test_a_version_carries_the_thresholds_its_export_recorded(tmp_path):
    from prefect_gliner2.session_core.thresholds import Thresholds, read_thresholds

    fitted = Thresholds(threshold=0.35, entities={"person": 0.3}, fitted=True, details={"f1": 0.9, "f1_default": 0.6})
    exported = model_dir(tmp_path / "a", "a")
    (exported / "export.json").write_text(json.dumps({"label": "best", "step": 4, "thresholds": fitted.to_dict()}))
    registry = ModelRegistry(str(tmp_path / "registry"), "ner")
    version = registry.register(str(exported), {"run_key": "r1"})
    assert version.lineage["thresholds"] == fitted.to_dict()
    assert read_thresholds(version.uri) == fitted  # the version's own export.json, read by evaluate and retraining
    plain = registry.register(str(model_dir(tmp_path / "b", "b")), {"run_key": "r2"})
    assert plain.lineage["thresholds"] is None
