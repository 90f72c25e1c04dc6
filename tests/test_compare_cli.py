"""``prefect-gliner2 compare``: the promotion decision between two model directories, from the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.cli import main
from prefect_gliner2.training.tiny import tiny_records


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A random tiny span model that extracts at threshold 0, and the same weights whose export.json records a
    threshold of 1.0 (it extracts nothing)."""
    from prefect_gliner2.training.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("compare")
    extracts = save_tiny_model(root / "extracts", "span", seed=0)
    silent = root / "silent"
    shutil.copytree(extracts, silent)
    (silent / "export.json").write_text(json.dumps({"thresholds": {"threshold": 1.0}}))
    data, guard = root / "test.jsonl", root / "guard.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(40, seed=3)))
    guard.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(12, seed=4)))
    return {"root": str(root), "extracts": str(extracts), "silent": str(silent), "data": str(data), "guard": str(guard)}


def _compare(models: dict[str, str], a: str, b: str, *extra: str) -> tuple[dict[str, Any], str]:
    out = str(Path(models["root"]) / f"{a}-{b}.json")
    argv = ["compare", "--a", models[a], "--b", models[b], "--data", models["data"], "--threshold", "0", *extra]
    assert main([*argv, "--json", out]) == 0
    return json.loads(Path(out).read_text()), out


def test_compare_decides_with_each_models_own_thresholds(
    models: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    lost, _ = _compare(models, "extracts", "silent", "--guard", models["guard"], "--resamples", "500")
    printed = capsys.readouterr().out
    decision, scores = lost["decision"], lost["scores"]
    assert (scores["data"]["current"]["thresholds_from"], scores["data"]["candidate"]["thresholds_from"]) == (
        "fallback",
        "recorded",
    )
    assert scores["data"]["candidate"]["eval_f1"] == 0.0 < scores["data"]["current"]["eval_f1"]
    assert decision["verdict"] == "rejected" and decision["rule"]["resamples"] == 500
    assert decision["guard"]["records"] == 12 and decision["guard"]["passed"] is False
    assert "vanished" in {label["verdict"] for label in decision["test"]["labels"]}
    assert printed.startswith(f"A (current): {models['extracts']} (threshold 0, fallback)\n")
    assert f"B (candidate): {models['silent']} (threshold 1, recorded)" in printed
    assert "promotion: rejected" in printed and "guard (12 records)" in printed and "data (40 records)" in printed

    # A's F1 is what `evaluate` reports for the same model, records, label order and threshold
    report = str(Path(models["root"]) / "evaluate.json")
    main(["evaluate", "--model", models["extracts"], "--data", models["data"], "--threshold", "0", "--json", report])
    assert json.loads(Path(report).read_text())["metrics"]["eval_f1"] == scores["data"]["current"]["eval_f1"]

    gained, _ = _compare(models, "silent", "extracts")
    difference = gained["decision"]["test"]["difference"]
    assert gained["decision"]["verdict"] == "promoted" and difference["low"] > 0.0
    assert difference["estimate"] == scores["data"]["current"]["eval_f1"]
    same, _ = _compare(models, "extracts", "extracts", "--base", models["silent"])
    assert same["decision"]["verdict"] == "rejected" and same["decision"]["test"]["base"]["estimate"] == 0.0
    assert "the candidate is not better" in same["decision"]["reasons"][0]


def test_compare_refuses_unusable_input(models: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compare", "--a", models["extracts"], "--b", models["silent"], "--data", models["data"]]
    for argv, message in [
        (["compare", "--a", models["extracts"], "--b", models["silent"], "--data", "/nope.jsonl"], "does not exist"),
        ([*base, "--guard", "/nope.jsonl"], "data '/nope.jsonl' does not exist"),
        ([*base, "--confidence", "2"], "PromotionRule.confidence must be strictly between 0 and 1, e.g. 0.95, got 2.0"),
        ([*base, "--method", "bca"], "PromotionRule.method must be one of"),
        ([*base, "--json", models["root"]], "is a directory"),
        (["compare", "--a", "./missing", "--b", models["silent"], "--data", models["data"]], "is not a model"),
    ]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
