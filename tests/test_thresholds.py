"""Thresholds that travel with a model: the export.json record, and per-label values that gliner2 really applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.thresholds import Thresholds, fixed, read_thresholds


def test_apply_writes_per_label_values_in_every_schema_form() -> None:
    t = Thresholds(threshold=0.3, entities={"person": 0.7}, relations={"works_for": 0.6}, fields={"order.id": 0.2})
    schema = {
        "entities": ["person", "city"],
        "relations": {"works_for": "employment", "born_in": ""},
        "structures": {"order": {"fields": [{"name": "id", "dtype": "str"}, {"name": "total", "dtype": "str"}]}},
        "classifications": [{"task": "topic", "labels": ["a", "b"]}],
    }
    applied = t.apply(schema)
    assert applied["entities"] == {"person": {"threshold": 0.7}, "city": {}}
    assert applied["relations"] == {"works_for": {"description": "employment", "threshold": 0.6}, "born_in": {}}
    assert applied["structures"]["order"]["fields"] == [
        {"name": "id", "dtype": "str", "threshold": 0.2},
        {"name": "total", "dtype": "str"},
    ]
    assert applied["classifications"] == schema["classifications"]
    assert schema["entities"] == ["person", "city"]  # the input is not changed
    assert (t.for_label("entities", "person"), t.for_label("entities", "city")) == (0.7, 0.3)
    assert fixed(0.4).apply(schema) == schema


def test_round_trip_and_refusals(tmp_path: Path) -> None:
    t = Thresholds(threshold=0.45, entities={"person": 0.4}, fitted=True, details={"records": 40, "step": 190})
    assert Thresholds.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    (tmp_path / "export.json").write_text(json.dumps({"label": "best", "thresholds": t.to_dict()}))
    assert read_thresholds(str(tmp_path)) == t
    (tmp_path / "export.json").write_text(json.dumps({"label": "best"}))
    assert read_thresholds(str(tmp_path)) is None
    assert read_thresholds(str(tmp_path / "missing")) is None
    with pytest.raises(ConfigError, match=r"threshold of entities 'person' must be in \[0, 1\], got 1.5"):
        Thresholds(entities={"person": 1.5})
    with pytest.raises(ConfigError, match="unknown threshold keys"):
        Thresholds.from_dict({"threshold": 0.5, "per_label": {}})
    with pytest.raises(ConfigError, match="must be a number"):
        fixed(float("nan"))


def test_gliner2_applies_the_per_label_values(tmp_path: Path) -> None:
    """A per-label threshold of 1.0 silences that label and only it: gliner2 reads the schema's value."""
    from gliner2.inference.schema import Schema

    from prefect_gliner2.runtime.model_sources import load_model

    model = load_model("tiny:span")
    texts = ["Alice met Bob in Paris on Monday.", "Carol joined Initech in Berlin."]
    labels = ["person", "city", "company"]
    low = Thresholds(threshold=0.0)  # every label extracts something from a pinned-count tiny model at 0
    silenced = Thresholds(threshold=0.0, entities={"city": 1.0})

    def extract(t: Thresholds) -> list[dict]:
        schemas = [Schema.from_dict(t.apply({"entities": labels})) for _ in texts]
        return model.batch_extract(texts, schemas, threshold=t.threshold)

    before, after = extract(low), extract(silenced)
    assert all(result["entities"]["city"] for result in before)
    assert all(not result["entities"]["city"] for result in after)
    for b, a in zip(before, after, strict=True):
        assert a["entities"]["person"] == b["entities"]["person"]
        assert a["entities"]["company"] == b["entities"]["company"]
