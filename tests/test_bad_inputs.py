"""The bad-input catalogue for session_core's public surfaces.

Each case names the surface, the bad input, the exact error class and words the message must contain (what was
wrong and what to do). Every case runs against a copy of shared artefacts and asserts that nothing on disk changed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from prefect_gliner2.session_core.manifest import read_manifest, write_manifest
from prefect_gliner2.training import (
    AdapterMismatchError,
    CheckpointError,
    ConfigError,
    ManagedTraining,
    ManagedTrainingPlan,
    ManifestError,
    PrecisionError,
    RecordError,
    TrainingConfig,
    TrainingSession,
    WeightsError,
)

from support.session import eval_records, make_config, make_model, make_plan, run_direct


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A span full-weight checkpoint and export, a LoRA adapter export, and a manifest."""
    root = tmp_path_factory.mktemp("artefacts")
    config = make_config("span", False)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=4)
    session.save_state(str(root / "ckpt"))
    session.export_weights(str(root / "model"))
    session.close()
    lora_config = make_config("span", True)
    lora = TrainingSession(make_model("span"), lora_config, max_steps=plan.max_steps)
    run_direct(lora, plan, stop=3)
    lora.export_weights(str(root / "lora"))
    lora.close()
    write_manifest(plan.to_manifest(eval_examples=eval_records()), str(root / "manifest.json"))
    (root / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in make_plan("span", config).records.examples(range(3)))
    )
    return root


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def span_session(**overrides: Any) -> TrainingSession:
    config = make_config("span", overrides.pop("lora", False), **overrides)
    return TrainingSession(make_model("span"), config, max_steps=make_plan("span", config).max_steps)


Case = Callable[[Path], Callable[[], Any]]  # prepare (may damage the copy) -> the refused operation


def now(action: Callable[[Path], Any]) -> Case:
    return lambda root: lambda: action(root)


def _config(**kw: Any) -> Case:
    return now(lambda root: make_config("span", False, **kw))


def _edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], Path]:
    def prepare(root: Path) -> Path:
        data = json.loads((root / name).read_text())
        change(data)
        (root / name).write_text(json.dumps(data))
        return root / name

    return prepare


def _records(rows: list[Any]) -> Case:
    return now(lambda root: ManagedTrainingPlan(rows, make_config("span", False), architecture="span"))


GOOD = {"input": "Alice lives in Paris.", "output": {"entities": {"person": ["Alice"], "city": ["Paris"]}}}


def _bad_jsonl(root: Path) -> Callable[[], Any]:
    (root / "train.jsonl").write_text(json.dumps(GOOD) + "\n{not json\n")
    return lambda: ManagedTrainingPlan(str(root / "train.jsonl"), make_config("span", False), architecture="span")


def _manifest_edit(root: Path) -> Callable[[], Any]:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["examples"][0] = (
        manifest["examples"][0].replace("a", "b", 1)
        if isinstance(manifest["examples"][0], str)
        else {**manifest["examples"][0], "input": "edited"}
    )
    (root / "manifest.json").write_text(json.dumps(manifest))
    return lambda: ManagedTrainingPlan.from_manifest(str(root / "manifest.json"))


def _manifest_schema(root: Path) -> Callable[[], Any]:
    manifest = read_manifest(str(root / "manifest.json"))
    manifest["schema"] = {**manifest["schema"], "version": 999} if isinstance(manifest["schema"], dict) else 999
    (root / "manifest.json").write_text(json.dumps(manifest))
    return lambda: ManagedTrainingPlan.from_manifest(str(root / "manifest.json"))


def _ckpt(change: Callable[[Path], None]) -> Case:
    def prepare(root: Path) -> Callable[[], Any]:
        change(root / "ckpt")
        return lambda: span_session().load_state(str(root / "ckpt"))

    return prepare


def _truncate(ckpt: Path) -> None:
    (ckpt / "weights.safetensors").write_bytes((ckpt / "weights.safetensors").read_bytes()[:64])


def _drop_file(ckpt: Path) -> None:
    (ckpt / "gradients.safetensors").unlink()


def _garbage_index(ckpt: Path) -> None:
    (ckpt / "checkpoint.json").write_text("{broken")


def _weights_from(path: str, **session_kw: Any) -> Case:
    return now(lambda root: span_session(**session_kw).load_weights(str(root / path)))


def _pickled_model(root: Path) -> Callable[[], Any]:
    target = root / "pickled"
    target.mkdir()
    (target / "config.json").write_bytes((root / "model" / "config.json").read_bytes())
    torch.save({"w": torch.zeros(1)}, target / "pytorch_model.bin")
    return lambda: span_session().load_weights(str(target))


def _wrong_shapes(root: Path) -> Callable[[], Any]:
    tensors = safetensors.torch.load_file(str(root / "model" / "model.safetensors"))
    name = next(k for k in sorted(tensors) if k.endswith("weight") and tensors[k].dim() == 2)
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    safetensors.torch.save_file(tensors, str(root / "model" / "model.safetensors"))
    return lambda: span_session().load_weights(str(root / "model"))


def _missing_shard(root: Path) -> Callable[[], Any]:
    shard = root / "sharded"
    shard.mkdir()
    (shard / "config.json").write_bytes((root / "model" / "config.json").read_bytes())
    (shard / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    return lambda: span_session().load_weights(str(shard))


def _adapter_type(root: Path) -> Callable[[], Any]:
    config = json.loads((root / "lora" / "adapter" / "adapter_config.json").read_text())
    config["peft_type"] = "IA3"
    (root / "lora" / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    return lambda: span_session(lora=True).load_weights(str(root / "lora" / "adapter"))


def _managed_metric(root: Path) -> Any:
    config = make_config("span", False, metric_for_best="f1")
    plan = make_plan("span", config)
    return ManagedTraining(
        TrainingSession(make_model("span"), config, max_steps=plan.max_steps), plan, eval_examples=eval_records()
    )


CASES: list[tuple[str, Case, type[Exception], str]] = [
    ("config: fp16", _config(fp16=True), ConfigError, "fp16"),
    ("config: precision omitted", now(lambda root: TrainingConfig()), ConfigError, "explicit"),
    ("config: num_workers", _config(num_workers=2), ConfigError, "num_workers"),
    ("config: distributed", _config(local_rank=0), ConfigError, "local_rank"),
    ("config: graph compilation", _config(compile_model=True), ConfigError, "compile_model"),
    ("config: skip_step_errors", _config(skip_step_errors=True), ConfigError, "skip_step_errors"),
    ("config: capacity policy", _config(on_capacity_exceeded="skip_sample"), ConfigError, "on_capacity_exceeded"),
    ("config: invalid samples", _config(allow_invalid_samples=True), ConfigError, "allow_invalid_samples"),
    ("config: sample caps", _config(max_train_samples=10), ConfigError, "max_train_samples"),
    (
        "config: unknown field",
        now(lambda root: TrainingConfig.from_dict({"fp16": False, "bf16": False, "batch_sise": 2})),
        ConfigError,
        "batch_size",
    ),
    ("config: wrong type", _config(batch_size="8"), ConfigError, "batch_size"),
    ("config: bad range", _config(gradient_accumulation_steps=0), ConfigError, "gradient_accumulation_steps"),
    ("records: no input", _records([{"output": {"entities": {"person": []}}}]), RecordError, "row 0"),
    (
        "records: mention not in text",
        _records([GOOD, {"input": "Bob is here.", "output": {"entities": {"person": ["Carol"]}}}]),
        RecordError,
        "row 1",
    ),
    ("records: empty", _records([]), RecordError, "empty"),
    ("records: malformed JSONL line", _bad_jsonl, RecordError, "line 2"),
    ("manifest: edited", _manifest_edit, ManifestError, "content address"),
    ("manifest: unknown schema", _manifest_schema, ManifestError, "999"),
    ("checkpoint: truncated", _ckpt(_truncate), CheckpointError, "truncated"),
    ("checkpoint: missing file", _ckpt(_drop_file), CheckpointError, "missing gradients.safetensors"),
    ("checkpoint: broken index", _ckpt(_garbage_index), CheckpointError, "not valid JSON"),
    (
        "checkpoint: plain directory",
        now(lambda root: span_session().load_state(str(root / "model"))),
        CheckpointError,
        "no committed checkpoint",
    ),
    (
        "checkpoint: immutable destination",
        now(lambda root: span_session().save_state(str(root / "ckpt"))),
        CheckpointError,
        "immutable",
    ),
    ("weights: pickled .bin only", _pickled_model, WeightsError, "Pickled"),
    ("weights: wrong shapes", _wrong_shapes, WeightsError, "shape"),
    ("weights: missing shard", _missing_shard, WeightsError, "missing"),
    ("weights: nonexistent path", _weights_from("nowhere"), WeightsError, "not a directory"),
    ("weights: adapter into full session", _weights_from("lora/adapter"), WeightsError, "use_lora=True"),
    ("adapter: different rank", _weights_from("lora/adapter", lora=True, lora_r=2), AdapterMismatchError, "lora_r"),
    ("adapter: not LoRA", _adapter_type, AdapterMismatchError, "IA3"),
    (
        "export: onto a non-empty directory",
        now(lambda root: span_session().export_weights(str(root / "model"))),
        WeightsError,
        "already exists",
    ),
    ("session: CPU bf16", now(lambda root: span_session(bf16=True)), PrecisionError, "bf16"),
    (
        "session: max_steps 0",
        now(lambda root: TrainingSession(make_model("span"), make_config("span", False), max_steps=0)),
        ConfigError,
        "max_steps",
    ),
    ("session: a single record as batch", now(lambda root: span_session().forward_backward(GOOD)), RecordError, "list"),
    ("managed: unknown metric", now(_managed_metric), ConfigError, "metric_for_best"),
]


@pytest.mark.parametrize(("name", "case", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly_and_damages_nothing(name, case, error, words, artefacts, tmp_path):
    root = tmp_path / "work"
    shutil.copytree(artefacts, root)
    operation = case(root)  # some cases damage their copy first: that damage is the bad input
    before, shared = tree_digest(root), tree_digest(artefacts)
    with pytest.raises(error) as caught:
        operation()
    assert words.lower() in str(caught.value).lower(), str(caught.value)
    assert tree_digest(root) == before, "the refused operation changed files on disk"
    assert tree_digest(artefacts) == shared
