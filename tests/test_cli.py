"""The console script: argument errors exit 2, plan/demo/train work, a crashed `train` resumes exactly on re-run."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_gliner2.flows.cli import main
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.training.tiny import tiny_records

from support.config import training_config
from support.flow import ROOT, assert_same_export, make_inputs, reference_export, wait_for_marker
from support.processes import assert_no_spare_left

HEAVY = ("torch", "numpy", "transformers", "gliner2", "peft", "safetensors")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    inputs = make_inputs(root / "data")
    (root / "config.json").write_text(json.dumps(training_config()))
    (root / "config.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in training_config().items()))
    return {"root": str(root), "config": str(root / "config.json"), "yaml": str(root / "config.yaml"), **inputs}


def _train_args(files: dict[str, str], **overrides: str) -> list[str]:
    values = {
        "--model": "tiny:span",
        "--train": files["train"],
        "--valid": files["valid"],
        "--config": files["config"],
        "--run-key": "cli",
        "--storage": os.path.join(files["root"], "runs"),
        **overrides,
    }
    return ["train", *[item for pair in values.items() for item in pair]]


def test_bad_arguments_exit_2_with_a_clear_message(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        ([], "the following arguments are required"),
        (["train", "--model", "tiny:span"], "required: --train\n"),
        (_train_args(files) + ["--checkpoint-every", "-1"], "must be >= 0"),
        (_train_args(files) + ["--batches-per-task", "x"], "must be an integer"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and message in capsys.readouterr().err
    bad_config = Path(files["root"]) / "bad.yaml"
    for text, message in [
        ("fp16: false\nbf16: false\nbatch_size: 0\n", "batch_size must be >= 1"),
        ("fp16: false\nbf16: false\nbatch_sise: 2\n", "did you mean 'batch_size'"),
        ("bf16: false\nbatch_size: 2\n", "precision must be explicit"),  # half of it: no choice is made for it
    ]:
        bad_config.write_text(text)
        assert main(_train_args(files, **{"--config": str(bad_config)})) == 2
        assert message in capsys.readouterr().err
    for overrides, message in [
        ({"--run-key": "../x"}, "invalid run key"),
        ({"--train": "/no/such/train.jsonl"}, "does not exist"),
        ({"--model": "./no/such/model"}, "is not a model directory"),
        ({"--model": "tiny:gpt"}, "unknown built-in model"),
        ({"--config": files["root"] + "/config.txt"}, "must end in .json, .yaml or .yml"),
    ]:
        assert main(_train_args(files, **overrides)) == 2
        assert message in capsys.readouterr().err
    run_dir = RunDirectory(os.path.join(files["root"], "runs"), "taken")
    run_dir.create()
    other = ManagedTrainingPlan(
        tiny_records(6, seed=1), TrainingConfig.from_dict(training_config()), architecture="span"
    )
    run_dir.ensure_manifest(other.manifest_bytes())
    assert main(_train_args(files, **{"--run-key": "taken"})) == 2
    assert "already holds a different manifest" in capsys.readouterr().err
    # the commands refused after their spare worker started (planning failed) left no process behind
    assert_no_spare_left()


def test_plan_prints_and_writes_a_manifest(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "manifest.json"
    argv = [
        "plan",
        "--model",
        "tiny:boundary",
        "--train",
        files["train"],
        "--valid",
        files["valid"],
        "--config",
        files["yaml"],
    ]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "12 batches over 2 epoch(s), 6 optimizer updates, 2 validation point(s)" in printed
    manifest = json.loads(out.read_text())
    assert manifest["architecture"] == "boundary" and manifest["fingerprint"] in printed
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert main([*argv, "--print"]) == 0
    assert json.loads(capsys.readouterr().out)["content_address"] == manifest["content_address"]


# The CLI's main() after installing a fault plan (argv[1], JSON): the way a test injects faults into a CLI run.
_CLI_WITH_FAULTS = (
    "import sys; from prefect_gliner2.runtime import faults; "
    "faults.install(faults.FaultPlan.from_json(sys.argv[1])); "
    "from prefect_gliner2.flows.cli import main; sys.exit(main(sys.argv[2:]))"
)


def _cli(argv: list[str], env: dict[str, str], plan: FaultPlan | None = None) -> subprocess.Popen[str]:
    script = os.path.join(os.path.dirname(sys.executable), "prefect-gliner2")
    command = [sys.executable, "-c", _CLI_WITH_FAULTS, plan.to_json(), *argv] if plan else [script, *argv]
    return subprocess.Popen(
        command,
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_train_through_the_embedded_server_resumes_after_a_crash(files: dict[str, str], tmp_path: Path) -> None:
    """No PREFECT_API_URL: the CLI starts its local Prefect server; kill -9 mid-run, re-run, exact result."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT)
    )
    argv = _train_args(files, **{"--run-key": "cli-crash", "--export": str(tmp_path / "model")}) + [
        "--checkpoint-every",
        "2",
        "--cpu-threads",
        "1",
    ]
    markers = tmp_path / "markers"
    markers.mkdir()
    crashed = _cli(argv, env, FaultPlan((Fault.pause("batch", 9, 120),), markers=str(markers)))
    try:
        wait_for_marker(markers, "batch-9", timeout=180)
    finally:
        os.killpg(crashed.pid, signal.SIGKILL)  # the CLI, its ephemeral server and its worker
        crashed.communicate(timeout=30)
    resumed = _cli(argv, env)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out + err[-4000:]
    step = json.loads((tmp_path / "model" / "export.json").read_text())["step"]
    assert f"model (best weights of step {step}): {tmp_path / 'model'}" in out
    # the newest checkpoint the killed run committed to its cursor: step 4 (batch 7) unless its commit was still
    # pending behind the pipelined work when the kill came (then step 2); either way the result is exact (below)
    assert re.search(r"resuming run cli-crash from checkpoint step-00000[24]-batch-00000[37]", err), err[-3000:]
    assert "batch 12/12 · step 6/6 · epoch 2/2" in err  # the progress bar (stderr)
    # the run's log tells the restoring worker's start phase by phase: it read its checkpoint ahead of the restore
    started = re.search(r"session worker \(pid \d+\) restored \S+; its start, [^:]*: (.*)", err)
    assert started is not None, err[-3000:]
    assert [p.split()[0] for p in started.group(1).split(", ")] in (
        ["imported", "run", "prefetch", "ready"],  # the spare imported before its run arrived
        ["run", "prefetch", "imported", "ready"],  # the run arrived while it imported torch
    ), started.group(0)
    reference = reference_export("tiny:span", files, training_config(), tmp_path / "direct")
    assert_same_export(str(tmp_path / "model"), reference)


def test_demo_trains_the_tiny_model_offline(
    prefect_server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real demo, at full size (about 2-3 minutes on 2 cores): its trained model meets the label-order target on
    the held-out records, micro F1 >= 0.93 under every one of 8 seeded random label orders with a spread <= 0.03, and
    every label's F1 >= 0.85 in each of those orders."""
    from prefect_gliner2.flows.demo import DEMO_CONFIG, DEMO_ORDERS, DEMO_SIZES
    from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES

    assert DEMO_ORDERS == 8
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    exported = json.loads((tmp_path / "demo" / "model" / "export.json").read_text())
    model_line = f"model (best weights of step {exported['step']}): {tmp_path / 'demo' / 'model'}"
    assert model_line in out and "Prefect flow run:" in out
    # the thresholds fitted on the validation records: in the run summary and used for the held-out scores
    assert out.count(f"fitted on {DEMO_SIZES['valid']} validation records: micro F1") == 2  # export line + scoring
    assert "best eval_f1_fitted:" in out  # selection by the F1 of the model the run ships
    assert f"held-out F1 on {DEMO_SIZES['test']} unseen records ({tmp_path / 'demo' / 'data' / 'test.jsonl'}):" in out
    assert "  before training: F1 " in out and "  after training:  F1 " in out
    assert re.search(r"after training:  F1 \d\.\d{3}, macro F1 \d\.\d{3}", out), out
    # the held-out per-label table: every label with its support and how many false positives are another label's
    for label in sorted(TINY_ENTITY_TYPES):
        assert re.search(rf"^  entities/{label} +\d\.\d{{4}} +\d\.\d{{4}} +\d\.\d{{4}} +\d+ +\d+", out, re.M), out
    assert out.count("  text:      ") == 3 and out.count("  extracted: ") == 3 and out.count("  gold:      ") == 3
    first = json.loads((tmp_path / "demo" / "data" / "test.jsonl").read_text().splitlines()[0])
    assert f"  text:      {first['input']}" in out
    spread = re.search(
        r"over 8 orders F1 (\d\.\d{3})-(\d\.\d{3}) \(in the training data's own order (\d\.\d{3})\)", out
    )
    assert spread, out
    low, high, canonical = (float(value) for value in spread.groups())
    assert low >= 0.93 and high - low <= 0.03 and canonical >= 0.93, out  # issue 43: micro >= 0.93 in every order
    lowest = re.search(r"each label's lowest F1 over the 8 orders: (.*)$", out, re.M)
    assert lowest, out
    per_label = dict(item.rsplit(" ", 1) for item in lowest.group(1).split(", "))
    assert sorted(per_label) == [f"entities/{label}" for label in sorted(TINY_ENTITY_TYPES)], out
    assert min(float(f1) for f1 in per_label.values()) >= 0.85, out  # no label silenced or confused in any order
    before = re.search(r"before training: F1 (\d\.\d{3})", out)
    assert before and float(before.group(1)) < 0.3  # it learned: the untrained model extracts next to nothing
    assert json.loads((tmp_path / "demo" / "model" / "export.json").read_text())["label"] == "best"
    assert (tmp_path / "demo" / "runs" / "demo" / "cursor.json").exists()
    _assert_the_demo_model_exports_to_onnx(tmp_path / "demo")
    # a demo directory left by a different plan (e.g. another version): a clear way out, nothing touched

    monkeypatch.setitem(DEMO_CONFIG, "seed", 8)
    before = sorted(p.name for p in (tmp_path / "demo" / "runs" / "demo" / "checkpoints").iterdir())
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 2
    assert "delete that directory to start the demo over, or pass another --dir" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "demo" / "runs" / "demo" / "checkpoints").iterdir()) == before


def _assert_the_demo_model_exports_to_onnx(demo: Path) -> None:
    """The demo's model as an ONNX export (fp32, int8) behind the parity gate on its validation records: loaded by
    the gliner2-onnx runtime as written, fp32 extracting exactly what the torch model extracts, int8 within 0.01 F1."""
    from gliner2_onnx import GLiNER2ONNXRuntime

    from prefect_gliner2.flows.demo import DEMO_SIZES

    argv = ["export", "--model", str(demo / "model"), "--format", "onnx", "--precision", "fp32", "int8"]
    assert main([*argv, "--data", str(demo / "data" / "valid.jsonl"), "--out", str(demo / "onnx")]) == 0
    record = json.loads((demo / "onnx" / "onnx_export.json").read_text())
    for precision, entry in record["precisions"].items():
        runtime = GLiNER2ONNXRuntime(str(demo / "onnx"), precision=precision)
        assert runtime.extract_entities("Noah Clark joined Soylent as a manager.", ["person", "company"], 0.3)
        assert entry["parity"]["passed"] and entry["parity"]["records"] == DEMO_SIZES["valid"], entry["parity"]
    fp32, int8 = (record["precisions"][p]["parity"] for p in ("fp32", "int8"))
    assert fp32["equal_lines"] == DEMO_SIZES["valid"] and fp32["span_agreement"] == 1.0 and fp32["f1_torch"] > 0.9
    assert abs(int8["f1_diff"]) <= 0.01, int8  # measured: 0.9870 for torch, fp32 and int8 alike


def test_flow_and_cli_modules_do_not_import_torch() -> None:
    script = (
        "import sys; import prefect_gliner2.flows.train, prefect_gliner2.flows.cli, prefect_gliner2.flows.demo, "
        "prefect_gliner2.flows.driver, prefect_gliner2.runtime.worker, prefect_gliner2.runtime.worker_child; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules) or 'none')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "none"


def test_a_recorded_manifest_is_what_a_run_key_resumes(files: dict[str, str], tmp_path: Path) -> None:
    """record_manifest (the CLI, before a flow run exists) writes a new run's manifest once, under the lease; the
    run key alone then prepares exactly that plan, and another plan under the key is refused, nothing written."""
    from prefect_gliner2.runtime.errors import RunConflictError
    from prefect_gliner2.runtime.prepare import prepare_run, record_manifest

    storage, cfg = str(tmp_path / "runs"), TrainingConfig.from_dict(training_config())
    prepared = prepare_run("tiny:span", files["train"], files["valid"], cfg, "once", storage)
    assert not prepared.run_dir.exists("manifest.json")
    assert record_manifest(prepared) is True and record_manifest(prepared) is False
    assert prepared.run_dir.read_bytes("manifest.json") == prepared.manifest
    resumed = prepare_run("tiny:span", None, None, None, "once", storage)
    assert resumed.manifest is None and resumed.has_validation
    assert (resumed.plan.fingerprint, resumed.content_address) == (prepared.plan.fingerprint, prepared.content_address)
    other = prepare_run("tiny:span", files["train"], None, cfg, "once", storage)
    with pytest.raises(RunConflictError, match="already holds a different manifest"):
        record_manifest(other)
    assert prepared.run_dir.read_bytes("manifest.json") == prepared.manifest


def test_a_run_handed_over_is_what_its_run_key_resumes_in_this_process(
    files: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """handed_over (the CLI, around its flow run): a resume of that run key alone is answered with the plan in memory
    and its manifest bytes, no manifest decoded; another model, run key or storage, a conflicting config, a removed
    manifest and the end of the block are prepared as without it; a different recorded manifest is refused when the
    run opens, before anything is written."""
    from prefect_gliner2.runtime.errors import RunConflictError
    from prefect_gliner2.runtime.prepare import handed_over, prepare_run, record_manifest
    from prefect_gliner2.runtime.run import RunOptions, open_run
    from prefect_gliner2.session_core import plan as plan_module
    from prefect_gliner2.session_core.errors import ConfigError

    decoded = _count_calls(monkeypatch, plan_module, "load_manifest")
    storage, cfg = str(tmp_path / "runs"), TrainingConfig.from_dict(training_config())
    prepared = prepare_run("tiny:span", files["train"], files["valid"], cfg, "handed", storage)
    record_manifest(prepared)
    with handed_over(prepared):
        assert prepare_run("tiny:span", None, None, None, "handed", storage) is prepared
        assert prepare_run("tiny:span", None, None, cfg, "handed", str(tmp_path / "runs/../runs")) is prepared
        assert decoded == []
        with pytest.raises(RunConflictError, match="planned with a different config"):
            prepare_run("tiny:span", None, None, TrainingConfig.from_dict(training_config(seed=99)), "handed", storage)
        other_model = prepare_run("tiny:boundary", None, None, None, "handed", storage)
        assert other_model is not prepared and other_model.manifest is None and len(decoded) == 1
        with pytest.raises(ConfigError, match="has no manifest"):
            prepare_run("tiny:span", None, None, None, "handed-not", storage)
        manifest = Path(prepared.run_dir.manifest_uri)
        recorded = manifest.read_bytes()
        manifest.unlink()  # gone since it was recorded: refused as without the hand-over
        with pytest.raises(ConfigError, match="has no manifest"):
            prepare_run("tiny:span", None, None, None, "handed", storage)
        other = prepare_run("tiny:span", files["train"], None, cfg, "handed", storage)
        manifest.write_bytes(other.manifest or b"")  # another plan recorded under the key meanwhile
        with pytest.raises(RunConflictError, match="already holds a different manifest"):
            open_run(prepare_run("tiny:span", None, None, None, "handed", storage), RunOptions(lease_wait=0))
        assert manifest.read_bytes() == other.manifest and not prepared.run_dir.exists("run.json")
        manifest.write_bytes(recorded)
    resumed = prepare_run("tiny:span", None, None, None, "handed", storage)
    assert resumed is not prepared and resumed.manifest is None and len(decoded) == 2
    assert (resumed.plan.fingerprint, resumed.content_address) == (prepared.plan.fingerprint, prepared.content_address)


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[object]:
    """Record each call of `owner.name` (patched for the test), returning the list the calls are appended to."""
    calls: list[object] = []
    original = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[0] if args else None)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_train_plans_before_the_flow_run_and_the_flow_resumes_that_plan(
    prefect_server: str,  # noqa: F811
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI plans to report bad input before a flow run exists and records the manifest; the flow run it starts
    is given the run key, not the data, and trains that plan, handed over in this process: the plan is built once
    here (from the data) and the manifest decoded by no one here (the worker decodes it, in its process)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    from prefect_gliner2.runtime.prepare import prepare_run
    from prefect_gliner2.session_core import plan as plan_module

    decoded = _count_calls(monkeypatch, plan_module, "load_manifest")
    built = _count_calls(monkeypatch, ManagedTrainingPlan, "__init__")
    storage = str(tmp_path / "runs")
    argv = _train_args(files, **{"--run-key": "cli-once", "--storage": storage})
    assert main([*argv, "--export", str(tmp_path / "model"), "--cpu-threads", "1", "--json"]) == 0
    assert (len(decoded), len(built)) == (0, 1)
    summary = json.loads(capsys.readouterr().out)
    planned = prepare_run(
        "tiny:span", files["train"], files["valid"], TrainingConfig.from_file(files["config"]), "x", storage
    )
    assert summary["fingerprint"] == planned.plan.fingerprint and summary["export"] == str(tmp_path / "model")
    with get_client(sync_client=True) as client:
        parameters = client.read_flow_run(UUID(summary["flow_run_id"])).parameters
    assert parameters["run_key"] == "cli-once" and parameters["storage"] == storage
    assert (parameters["train_data"], parameters["valid_data"], parameters["config"]) == (None, None, None)
    assert parameters["checkpointing"]["checkpoint_every"] == "auto" and parameters["execution"]["cpu_threads"] == 1


def test_a_config_the_run_would_refuse_is_refused_before_anything_is_written(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Early stopping without validation data: exit 2 with the session's message, no run directory (a manifest
    left behind would refuse the corrected command under the same run key)."""
    config = tmp_path / "early.json"
    config.write_text(json.dumps(training_config(early_stopping=True)))
    argv = ["train", "--model", "tiny:span", "--train", files["train"], "--config", str(config)]
    assert main([*argv, "--run-key", "early", "--storage", str(tmp_path / "runs")]) == 2
    assert "early_stopping=True needs eval_examples" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "early").exists()


# ---- evaluate ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from prefect_gliner2.training.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("evaluate")
    model = save_tiny_model(root / "model", "span", seed=0)
    data = root / "gold.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(6, seed=3)))
    return {"root": str(root), "model": str(model), "data": str(data)}


def test_evaluate_prints_per_label_scores_and_totals(
    scored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from gliner2 import AutoExtractor

    from prefect_gliner2.session_core.label_order import shuffle_schema
    from prefect_gliner2.session_core.scoring import DatasetSchema, score_records
    from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES

    out = os.path.join(scored["root"], "report.json")
    argv = ["evaluate", "--model", scored["model"], "--data", scored["data"], "--threshold", "0.0", "--json", out]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(Path(out).read_text())
    records = tiny_records(6, seed=3)
    model = AutoExtractor.from_pretrained(scored["model"])
    labels = list(DatasetSchema.of([r["output"] for r in records]).entities)  # the data's labels, first-seen order
    assert sorted(labels) == sorted(TINY_ENTITY_TYPES)
    # each record's labels asked in its own seeded order (seed 0, the first of the --orders trials), one at a time
    orders = [shuffle_schema({"entities": labels}, seed=0, position=i)["entities"] for i in range(len(records))]
    assert len({tuple(order) for order in orders}) > 1  # the orders differ between records
    extracted = [
        model.batch_extract_entities([r["input"]], order, threshold=0.0)[0]
        for r, order in zip(records, orders, strict=True)
    ]
    expected = score_records([r["output"] for r in records], extracted)
    canonical = score_records(
        [r["output"] for r in records],
        model.batch_extract_entities([r["input"] for r in records], labels, threshold=0.0),
    )
    assert report["label_order"]["eval_f1_canonical"] == canonical.metrics()["eval_f1"]
    assert report["label_order"]["eval_f1_order_min"] <= expected.metrics()["eval_f1"]
    assert expected.metrics()["eval_f1"] <= report["label_order"]["eval_f1_order_max"]
    assert expected.total().predicted > 0  # threshold 0: the random model extracts, so the numbers are not all 0
    assert report["metrics"] == expected.metrics() and report["per_label"] == expected.rows()
    assert (report["threshold"], report["records"], report["total"]["support"]) == (0.0, 6, expected.total().support)
    lines = printed.splitlines()
    assert lines[0].split() == [
        "label",
        "precision",
        "recall",
        "F1",
        "support",
        "fp",
        "that",
        "are",
        "another",
        "label's",
    ]
    assert [line.split()[0] for line in lines[1:5]] == [f"entities/{label}" for label in sorted(TINY_ENTITY_TYPES)]
    total = expected.total()
    assert lines[6].split() == [
        "all",
        "(micro)",
        f"{total.precision:.4f}",
        f"{total.recall:.4f}",
        f"{total.f1:.4f}",
    ] + [str(total.support)]
    assert f"tp {total.tp}, fp {total.fp}, fn {total.fn}" in lines[7]
    metrics = expected.metrics()
    assert lines[7].startswith(f"micro F1 {metrics['eval_f1']:.4f}, macro F1 {metrics['eval_macro_f1']:.4f} over 4")
    # per label: how many false positives are another label's gold mentions (threshold 0: the model tags widely)
    for line, row in zip(lines[1:5], expected.rows(), strict=True):
        assert line.split()[5] == str(row["confused"])
    assert any(row["confused"] for row in expected.rows())
    zero = [f"{r['kind']}/{r['label']} ({r['support']} gold)" for r in expected.rows() if r["support"] and not r["f1"]]
    assert (f"WARNING: F1 0 on these records for label(s) with gold mentions: {', '.join(zero)}" in printed) == bool(
        zero
    )


def test_evaluate_refuses_unusable_input(scored: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    empty_dir = os.path.join(scored["root"], "not-a-model")
    os.makedirs(empty_dir, exist_ok=True)
    bad_records = os.path.join(scored["root"], "bad.jsonl")
    Path(bad_records).write_text('{"input": "Alice", "output": {"entities": {"person": ["Bob"]}}}\nnot json\n')
    model, data = scored["model"], scored["data"]
    for argv, message in [
        (["evaluate", "--model", model, "--data", "/nope.jsonl"], "data '/nope.jsonl' does not exist"),
        (["evaluate", "--model", empty_dir, "--data", data], "has no config.json"),
        (["evaluate", "--model", "./missing-model", "--data", data], "is not a model directory"),
        (["evaluate", "--model", model, "--data", bad_records], "evaluation"),
        (["evaluate", "--model", model, "--data", data, "--json", scored["root"]], "is a directory"),
    ]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    for threshold, message in [("2", "must be in [0, 1], got 2"), ("x", "must be a number in [0, 1]")]:
        with pytest.raises(SystemExit) as exit_info:
            main(["evaluate", "--model", model, "--data", data, "--threshold", threshold])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
