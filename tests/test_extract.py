"""Extraction with a trained model: ``prefect-gliner2 extract`` and the ``gliner2-extract`` flow, each killed for
real mid-run (SIGKILL after some chunks are committed) and run again: the output is complete, has no duplicate,
and equals an uninterrupted run's byte for byte. The fitted thresholds an export records are used by default and
an explicit threshold replaces them (both checked against gliner2's own batch_extract); long texts go through
gliner2's chunking and are reported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.cli import main
from prefect_gliner2.flows.extract import extract_flow
from prefect_gliner2.model_registry.store import ModelRegistry
from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job, run_chunk, run_job
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.model_sources import tiny_model_dir
from prefect_gliner2.session_core.errors import ConfigError, RecordError
from prefect_gliner2.session_core.layout import EXPORT_MARKER_FILE
from prefect_gliner2.session_core.thresholds import Thresholds
from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES, tiny_records

from support.flow import FAULT_SITE, ROOT, TESTS, installed_faults, wait_for_marker
from support.processes import kill9

LABELS = list(TINY_ENTITY_TYPES)
CHUNK_WORDS, OVERLAP, PER_CHUNK = 40, 8, 4
FITTED = {"threshold": 0.3, "entities": {"person": 0.7}, "fitted": True}


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Input texts (some with their own labels, one long), a registry whose CURRENT is the tiny model (v000001;
    v000002, registered later and not promoted, records fitted thresholds), and that export on its own."""
    root = tmp_path_factory.mktemp("extract")
    texts = [record["input"] for record in tiny_records(36, seed=3)]
    lines = [json.dumps({"text": text, "id": f"doc-{i}"}) for i, text in enumerate(texts)]
    lines[5] = json.dumps({"text": texts[5], "labels": ["city", "person"]})
    lines.insert(9, "")  # a blank line: no record, no output line
    lines.append(json.dumps({"text": " ".join(texts[:8]), "id": "long"}))
    (root / "in.jsonl").write_text("\n".join(lines) + "\n")
    base = tiny_model_dir("span", 32, 1)
    export = root / "export"
    shutil.copytree(base, export)
    (export / EXPORT_MARKER_FILE).write_text(
        json.dumps({"label": "best", "thresholds": FITTED, "schema": {"entities": LABELS}})
    )
    registry = ModelRegistry(str(root / "registry"), "ner")
    registry.promote(registry.register(base, {"run_key": "first"}).version)
    registry.register(str(export), {"run_key": "second"})
    return {"root": root, "data": str(root / "in.jsonl"), "texts": texts, "export": str(export), "base": base}


def _settings(**overrides: Any) -> ExtractSettings:
    values: dict[str, Any] = {
        "labels": LABELS,
        "records_per_chunk": PER_CHUNK,
        "chunk_size": CHUNK_WORDS,
        "chunk_overlap": OVERLAP,
        **overrides,
    }
    return ExtractSettings(**values)


def _reference(space: dict[str, Any], name: str, model: str, **overrides: Any) -> tuple[dict[str, Any], bytes]:
    """An uninterrupted run in this process."""
    out = space["root"] / f"{name}.jsonl"
    summary = run_job(prepare_job(model, space["data"], str(out), _settings(**overrides)))
    return summary, out.read_bytes()


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def _assert_complete(data: bytes) -> None:
    """One line per record, in input order, none twice."""
    numbers = [line["line"] for line in _lines(data)]
    assert numbers == sorted(set(numbers)) and len(numbers) == 37 and 10 not in numbers, numbers


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAULT_SITE), str(TESTS), str(ROOT)]), **extra)
    env.pop("SUPPORT_FAULT_PLAN", None)
    return env


def _kill_before_chunk(command: list[str], env: dict[str, str], markers: Path, index: int) -> None:
    """Run `command` until it is about to compute chunk `index` (chunks before it committed), then SIGKILL it."""
    markers.mkdir()
    plan = FaultPlan((Fault.pause("chunk", index, 600),), markers=str(markers))
    first = subprocess.Popen(
        command,
        cwd=str(ROOT),
        env={**env, "SUPPORT_FAULT_PLAN": plan.to_json()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_marker(markers, f"chunk-{index}", first, timeout=180)
    finally:
        kill9(first)


def test_cli_killed_mid_run_resumes_to_the_uninterrupted_output(
    space: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    registry = str(space["root"] / "registry" / "ner")
    summary, expected = _reference(space, "cli-reference", f"{registry}@v000001")
    assert summary["version"] == "v000001" and summary["computed"] == summary["chunks"] == 10
    out = space["root"] / "cli.jsonl"
    command = [sys.executable, "-m", "prefect_gliner2.flows.cli", "extract", "--model", registry]
    command += ["--data", space["data"], "--out", str(out), "--labels", ",".join(LABELS)]
    command += ["--chunk-records", str(PER_CHUNK), "--chunk-size", str(CHUNK_WORDS), "--chunk-overlap", str(OVERLAP)]
    work = space["root"] / ".cli.jsonl.extract"
    _kill_before_chunk(command, _env(), space["root"] / "cli-markers", 4)
    assert sorted(p.name for p in work.glob("part-*.json")) == [f"part-{i:06d}.json" for i in range(4)]
    assert not out.exists()  # published only once complete
    assert main(command[3:]) == 0  # the same command, run again (here: in this process)
    stdout = capsys.readouterr().out
    assert out.read_bytes() == expected  # CURRENT (v000001) by default; nothing lost, nothing twice
    _assert_complete(out.read_bytes())
    assert "resumed: 4 of 10 chunk(s) were done by an earlier run" in stdout, stdout
    assert f"model {registry} version v000001" in stdout
    assert not list(work.glob("part-*"))  # the parts are gone once the output is published
    again = run_job(prepare_job(registry, space["data"], str(out), _settings()))
    assert again["already_committed"] and again["records"] == 37  # a third run has nothing to do


FLOW_CHILD = """
import json, sys
from prefect_gliner2.flows.extract import extract_flow
print(json.dumps(extract_flow(**json.loads(sys.argv[1]))))
"""


def test_flow_killed_mid_run_and_a_failed_chunk_retried(prefect_server: str, space: dict[str, Any]) -> None:
    registry_root = str(space["root"] / "registry")
    _, expected = _reference(space, "flow-reference", f"{registry_root}/ner@v000001", threshold=0.4)
    out = space["root"] / "flow.jsonl"
    params = {"model_name": "ner", "registry_root": registry_root, "data": space["data"], "out": str(out)}
    params.update(labels=LABELS, threshold=0.4, records_per_task=PER_CHUNK, chunk_size=CHUNK_WORDS)
    params.update(chunk_overlap=OVERLAP)
    command = [sys.executable, "-c", FLOW_CHILD, json.dumps(params)]
    env = _env(PREFECT_API_URL=prefect_server)
    _kill_before_chunk(command, env, space["root"] / "flow-markers", 3)
    assert not out.exists()
    once = space["root"] / "fail-once"
    with installed_faults(FaultPlan((Fault.fail("chunk", 7, once=str(once)),))):  # chunk 7 fails once
        summary = extract_flow(**params)  # the rerun, here in this process
    assert once.exists()  # chunk 7 failed once, and its task was retried
    assert (summary["reused"], summary["computed"], summary["records"]) == (3, 7, 37)
    assert out.read_bytes() == expected
    _assert_complete(out.read_bytes())


def _direct(space: dict[str, Any], model: Any, thresholds: Thresholds) -> list[Any]:
    """gliner2's own batch_extract (batch_extract_long for texts over the window) with the same schemas."""
    from gliner2.inference.schema import Schema

    from prefect_gliner2.runtime.extract_input import read_chunk, scan_input

    results = []
    for record in read_chunk(scan_input(space["data"], 1000), 0):
        schema = Schema.from_dict(thresholds.apply(record.schema or {"entities": LABELS}))
        if _words(model, record.text) > CHUNK_WORDS:
            results += model.batch_extract_long(
                [record.text], [schema], threshold=thresholds.threshold, chunk_size=CHUNK_WORDS, chunk_overlap=OVERLAP
            )
        else:
            results += model.batch_extract([record.text], [schema], threshold=thresholds.threshold)
    return results


def _words(model: Any, text: str) -> int:
    from gliner2.processing.word_splitter import word_splitter_from

    return sum(1 for _ in word_splitter_from(model)(text, lower=False))


def test_fitted_thresholds_by_default_an_explicit_one_replaces_them_and_long_texts_are_chunked(
    space: dict[str, Any],
) -> None:
    from gliner2.inference.chunking import split_text_into_chunks
    from gliner2.processing.word_splitter import word_splitter_from

    from prefect_gliner2.training.weights import load_exported_model

    model = load_exported_model(space["export"])
    fitted = Thresholds.from_dict(FITTED)
    summary, data = _reference(space, "fitted", space["export"], labels=None)  # labels from its export.json
    assert "0.3 and 1 per-label value(s), fitted" in summary["threshold_source"]
    assert [line["extraction"] for line in _lines(data)] == _direct(space, model, fitted)
    _, explicit = _reference(space, "explicit", space["export"], threshold=0.9)
    assert [line["extraction"] for line in _lines(explicit)] == _direct(space, model, Thresholds(threshold=0.9))
    assert _lines(explicit) != _lines(data)
    splitter = word_splitter_from(model)
    windows = {
        line["line"]: len(split_text_into_chunks(text, CHUNK_WORDS, OVERLAP, splitter))
        for line, text in zip(_lines(data), [*space["texts"], " ".join(space["texts"][:8])], strict=True)
        if _words(model, text) > CHUNK_WORDS
    }
    assert len(windows) >= 2 and max(windows.values()) >= 3  # the long text and some over the window
    assert {line["line"]: line.get("chunks") for line in _lines(data) if "chunks" in line} == windows
    assert (summary["texts_chunked"], summary["text_chunks"]) == (len(windows), sum(windows.values()))


def test_the_summary_says_how_long_texts_were_handled_and_says_so_plainly_when_none_was_split() -> None:
    from prefect_gliner2.flows.cli.extract import describe

    base = {"records": 3, "out": "o.jsonl", "reused": 0, "chunks": 1, "chunk_size": 384, "chunk_overlap": 64}
    base |= {"model": "m", "threshold_source": "0.5"}
    quiet = describe({**base, "texts_chunked": 0, "text_chunks": 0})
    assert "  no text was longer than 384 words: none was split" in quiet.splitlines()
    assert "windows" not in quiet
    split = describe({**base, "texts_chunked": 2, "text_chunks": 5})
    assert "2 text(s) longer than 384 words were split into 5 overlapping windows" in split
    assert "none was split" not in split


def test_bad_input_and_conflicting_reruns_are_refused(space: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no text"}\n')
    with pytest.raises(RecordError, match="line 2: 'text' must be a string"):
        prepare_job(space["base"], str(bad), str(tmp_path / "o.jsonl"), _settings())
    bad.write_text('{"text": "ok"}\n{"text": "x", "labels": []}\n')
    with pytest.raises(RecordError, match="line 2: 'labels' must be a non-empty list"):
        prepare_job(space["base"], str(bad), str(tmp_path / "o.jsonl"), _settings())
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(RecordError, match="line 2 is not valid JSON"):
        prepare_job(space["base"], str(bad), str(tmp_path / "o.jsonl"), _settings())
    with pytest.raises(ConfigError, match="no --labels were given and model .* records no labels"):
        prepare_job(space["base"], space["data"], str(tmp_path / "o.jsonl"), _settings(labels=None))
    out = tmp_path / "o.jsonl"
    prepare_job(space["base"], space["data"], str(out), _settings())  # recorded, not run
    with pytest.raises(ConfigError, match="with other settings; rerun with the same arguments"):
        prepare_job(space["base"], space["data"], str(out), _settings(batch_size=3))
    out.with_name("taken.jsonl").write_text("")
    with pytest.raises(ConfigError, match="already exists"):
        prepare_job(space["base"], space["data"], str(tmp_path / "taken.jsonl"), _settings())


def test_a_registry_input_and_output_on_object_storage(space: dict[str, Any], s3_bucket: str) -> None:
    """Everything on S3 (a real S3 API server): the registry model, the input, the work directory, the output."""
    import fsspec

    registry = ModelRegistry(f"{s3_bucket}/registry", "ner")
    registry.promote(registry.register(space["base"], {"run_key": "s3"}).version)
    fs, _ = fsspec.core.url_to_fs(s3_bucket)
    fs.put_file(space["data"], f"{s3_bucket}/in.jsonl")
    _, expected = _reference(space, "s3-reference", space["base"])  # the same weights, from a local directory
    out = f"{s3_bucket}/out/x.jsonl"
    job = prepare_job(f"{s3_bucket}/registry/ner", f"{s3_bucket}/in.jsonl", out, _settings())
    assert job.model.version == "v000001" and job.work == f"{s3_bucket}/out/.x.jsonl.extract"
    for index in (0, 1):  # a run that stopped after two chunks
        run_chunk(job, index)
    assert not fs.exists(out)
    summary = run_job(prepare_job(f"{s3_bucket}/registry/ner", f"{s3_bucket}/in.jsonl", out, _settings()))
    assert (summary["reused"], summary["computed"]) == (2, 8)
    assert fs.cat_file(out) == expected
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(job.work, detail=False)] == ["job.json"]
