"""TrainingConfig: defaults, every refusal and range check, serialization, native kwargs and fingerprint fields."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os

import fsspec
import pytest

from prefect_gliner2.session_core.config import NON_FINGERPRINT_FIELDS, OWN_FIELDS, TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError

BASE = {"fp16": False, "bf16": False}


def _cfg(**changes: object) -> TrainingConfig:
    return TrainingConfig(**{**BASE, **changes})  # type: ignore[arg-type]


def _rejects(match: str, **changes: object) -> str:
    with pytest.raises(ConfigError) as info:
        _cfg(**changes)
    message = str(info.value)
    assert match in message, message
    return message


def test_defaults_follow_native_except_documented_changes() -> None:
    cfg = _cfg()
    assert cfg.num_workers == 0
    assert cfg.eval_strategy == "epoch"
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.num_epochs, cfg.max_steps) == (2, 1, 10, -1)
    assert (cfg.encoder_lr, cfg.task_lr, cfg.seed) == (1e-5, 5e-4, 42)
    assert (cfg.metric_for_best, cfg.greater_is_better, cfg.eval_extraction, cfg.eval_threshold) == (
        "eval_f1_fitted",
        True,
        True,
        0.5,
    )
    assert cfg.on_capacity_exceeded == "raise" and cfg.strict_training is True
    assert cfg.lora_target_modules == ("encoder", "span_rep", "classifier", "count_embed", "count_pred")
    assert (cfg.deterministic, cfg.allow_tf32, cfg.float32_matmul_precision) == (True, False, "highest")
    assert cfg.effective_batch_size == 2


def test_selection_defaults_follow_extraction_and_the_metrics_direction() -> None:
    assert (_cfg(eval_extraction=False).metric_for_best, _cfg(eval_extraction=False).greater_is_better) == (
        "eval_loss",
        False,
    )
    assert _cfg(metric_for_best="eval_loss").greater_is_better is False
    assert _cfg(metric_for_best="eval_entity_f1").greater_is_better is True
    assert _cfg(metric_for_best="eval_loss", greater_is_better=True).greater_is_better is True  # explicit: kept
    loss_only = _cfg().replace(eval_extraction=False)
    assert (loss_only.metric_for_best, loss_only.greater_is_better) == ("eval_loss", False)
    assert _cfg().replace(metric_for_best="eval_count_loss").greater_is_better is False
    assert TrainingConfig.from_dict(_cfg().to_dict()) == _cfg()
    assert "eval_threshold" not in _cfg().to_native_kwargs() and "eval_extraction" not in _cfg().to_native_kwargs()
    _rejects("eval_threshold must be in [0, 1], got 1.5", eval_threshold=1.5)
    _rejects("set eval_extraction=True, or metric_for_best=", eval_extraction=False, metric_for_best="eval_f1")


@pytest.mark.parametrize("changes", [{}, {"fp16": False}, {"bf16": False}, {"fp16": None, "bf16": True}])
def test_precision_must_be_explicit(changes: dict) -> None:
    kwargs = {k: v for k, v in changes.items() if v is not None}
    with pytest.raises(ConfigError, match="precision must be explicit: pass fp16=False and bf16=True/False"):
        TrainingConfig(**kwargs)


def test_fp16_is_refused_in_any_form() -> None:
    _rejects("fp16=True is not supported", fp16=True)
    _rejects("fp16 and bf16 cannot both be True", fp16=True, bf16=True)


def test_bf16_is_accepted_without_cuda() -> None:
    assert _cfg(bf16=True).bf16 is True


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_workers": 2}, "num_workers must be 0"),
        ({"local_rank": 0}, "distributed training is not supported"),
        ({"compile_model": True}, "compile_model=True is not supported"),
        ({"skip_step_errors": True}, "skip_step_errors=True would silently drop"),
        ({"allow_invalid_samples": True}, "allow_invalid_samples=True would silently drop"),
        ({"on_capacity_exceeded": "truncate_with_warning"}, "on_capacity_exceeded='truncate_with_warning'"),
        ({"on_capacity_exceeded": "skip_sample"}, "set on_capacity_exceeded='raise'"),
        ({"strict_training": False}, "strict_training=False"),
        ({"ignore_nonfinite_losses": True}, "ignore_nonfinite_losses=True"),
        ({"max_train_samples": 100}, "max_train_samples=100 would silently drop training data"),
        ({"max_eval_samples": 10}, "max_eval_samples=10 would silently drop validation data"),
        ({"early_stopping": True, "eval_strategy": "no"}, "early_stopping=True needs validation points"),
    ],
)
def test_refused_settings(changes: dict, match: str) -> None:
    _rejects(match, **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"batch_size": "2"}, "batch_size must be an int, got str '2'"),
        ({"batch_size": True}, "batch_size must be an int, got bool True"),
        ({"batch_size": 2.0}, "batch_size must be an int, got float"),
        ({"encoder_lr": "1e-5"}, "encoder_lr must be a float, got str"),
        ({"encoder_lr": True}, "encoder_lr must be a float, got bool"),
        ({"use_lora": 1}, "use_lora must be a bool, got int"),
        ({"fp16": "no"}, "fp16 must be a bool, got str"),
        ({"max_len": 2.5}, "max_len must be an int or None"),
        ({"lora_target_modules": ["encoder", 3]}, "lora_target_modules must be a list of str"),
        ({"lora_target_modules": "encoder"}, "lora_target_modules must be a list of str"),
        ({"output_dir": None}, "output_dir must be a str"),
        ({"task_lr": float("nan")}, "task_lr must be a finite number"),
        ({"warmup_ratio": float("inf")}, "warmup_ratio must be a finite number"),
    ],
)
def test_wrong_types(changes: dict, match: str) -> None:
    _rejects(match, **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"eval_batch_size": 0}, "eval_batch_size must be >= 1"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1"),
        ({"num_epochs": 0}, "num_epochs must be >= 1"),
        ({"logging_steps": 0}, "logging_steps must be >= 1"),
        ({"length_group_window_batches": 0}, "length_group_window_batches must be >= 1"),
        ({"early_stopping_patience": 0}, "early_stopping_patience must be >= 1"),
        ({"eval_strategy": "steps", "eval_steps": 0}, "eval_steps must be >= 1, got 0"),
        ({"max_steps": 0}, "max_steps must be -1 (derive from num_epochs) or >= 1, got 0"),
        ({"max_steps": -2}, "max_steps must be -1"),
        ({"encoder_lr": -1e-5}, "encoder_lr must be >= 0"),
        ({"task_lr": -1.0}, "task_lr must be >= 0"),
        ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"warmup_ratio": 1.5}, "warmup_ratio must be in [0, 1], got 1.5"),
        ({"warmup_ratio": -0.1}, "warmup_ratio must be in [0, 1]"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0"),
        ({"adam_beta1": 1.0}, "adam_beta1 must be in [0, 1)"),
        ({"adam_beta2": -0.1}, "adam_beta2 must be in [0, 1)"),
        ({"adam_epsilon": -1e-8}, "adam_epsilon must be >= 0"),
        ({"gold_injection_start": 1.1}, "gold_injection_start must be in [0, 1]"),
        ({"gold_injection_end": -0.5}, "gold_injection_end must be in [0, 1]"),
        ({"gold_injection_hold_frac": 2.0}, "gold_injection_hold_frac must be in [0, 1]"),
        ({"float32_matmul_precision": "low"}, "float32_matmul_precision must be one of ['highest', 'high', 'medium']"),
        (
            {"scheduler_type": "step"},
            "scheduler_type must be one of ['linear', 'cosine', 'cosine_restarts', 'constant']",
        ),
        ({"eval_strategy": "always"}, "eval_strategy must be one of ['epoch', 'steps', 'no']"),
        ({"seed": -1}, "seed must be in [0, 2**32)"),
        ({"seed": 2**32}, "seed must be in [0, 2**32)"),
        ({"max_len": 0}, "max_len must be None or >= 1"),
        ({"output_dir": ""}, "output_dir must be a non-empty path"),
        ({"metric_for_best": ""}, "metric_for_best must be a non-empty metric name"),
        ({"use_lora": True, "lora_r": 0}, "lora_r must be >= 1 when use_lora=True"),
        ({"use_lora": True, "lora_alpha": 0.0}, "lora_alpha must be > 0"),
        ({"use_lora": True, "lora_dropout": 1.0}, "lora_dropout must be in [0, 1)"),
        ({"use_lora": True, "lora_dropout": -0.1}, "lora_dropout must be in [0, 1)"),
        ({"use_lora": True, "lora_target_modules": []}, "lora_target_modules cannot be empty when use_lora=True"),
        ({"use_lora": True, "lora_target_modules": ["encoder", ""]}, "lora_target_modules entries must be non-empty"),
    ],
)
def test_range_checks(changes: dict, match: str) -> None:
    _rejects(match, **changes)


def test_lora_ranges_only_apply_with_lora_and_eval_steps_only_matters_for_steps() -> None:
    cfg = _cfg(lora_r=0, lora_target_modules=[], eval_strategy="epoch")
    assert cfg.lora_target_modules == ()
    assert _cfg(use_lora=True, lora_r=4, lora_target_modules=["encoder"]).lora_target_modules == ("encoder",)


def test_all_problems_are_reported_together() -> None:
    message = _rejects("invalid TrainingConfig:", num_workers=4, batch_size=0, compile_model=True)
    assert "num_workers must be 0" in message and "batch_size must be >= 1" in message
    assert "compile_model=True" in message


def test_ints_for_float_fields_are_stored_as_floats() -> None:
    cfg = _cfg(encoder_lr=0, max_grad_norm=2)
    assert isinstance(cfg.encoder_lr, float) and cfg.encoder_lr == 0.0
    assert cfg == _cfg(encoder_lr=0.0, max_grad_norm=2.0)
    assert json.dumps(cfg.to_dict()) == json.dumps(_cfg(encoder_lr=0.0, max_grad_norm=2.0).to_dict())


def test_frozen_and_hashable() -> None:
    cfg = _cfg()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 4  # type: ignore[misc]
    assert hash(cfg) == hash(_cfg())


def test_dict_round_trip() -> None:
    cfg = _cfg(bf16=True, batch_size=4, use_lora=True, lora_target_modules=["encoder", "classifier"], max_len=128)
    data = cfg.to_dict()
    assert data["lora_target_modules"] == ["encoder", "classifier"]
    assert json.loads(json.dumps(data)) == data
    assert TrainingConfig.from_dict(json.loads(json.dumps(data))) == cfg


def test_from_dict_lists_every_unknown_field_with_suggestions() -> None:
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict({**BASE, "batchsize": 2, "lerning_rate": 1e-5, "zzz_unrelated": 1})
    message = str(info.value)
    assert "'batchsize' (did you mean 'batch_size'?)" in message
    assert "'zzz_unrelated'" in message and "lerning_rate" in message
    with pytest.raises(ConfigError, match="must be a mapping"):
        TrainingConfig.from_dict([("fp16", False)])  # type: ignore[arg-type]


def test_replace_revalidates_and_rejects_unknown_names() -> None:
    cfg = _cfg()
    assert cfg.replace(batch_size=8).batch_size == 8
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        cfg.replace(batch_size=0)
    with pytest.raises(ConfigError, match="did you mean 'num_epochs'"):
        cfg.replace(num_epoch=3)


def test_from_file_json_yaml_and_fsspec_url(tmp_path: os.PathLike) -> None:
    data = {**BASE, "batch_size": 4, "lora_target_modules": ["encoder"]}
    json_path = os.path.join(tmp_path, "cfg.json")
    with open(json_path, "w") as handle:
        json.dump(data, handle)
    yaml_path = os.path.join(tmp_path, "cfg.yaml")
    with open(yaml_path, "w") as handle:
        handle.write("fp16: false\nbf16: false\nbatch_size: 4\nlora_target_modules:\n  - encoder\n")
    with fsspec.open("memory://configs/cfg.yml", "w") as handle:
        handle.write("fp16: false\nbf16: false\nbatch_size: 4\nlora_target_modules: [encoder]\n")
    expected = TrainingConfig.from_dict(data)
    assert TrainingConfig.from_file(json_path) == expected
    assert TrainingConfig.from_file(yaml_path) == expected
    assert TrainingConfig.from_file("memory://configs/cfg.yml") == expected


def test_from_file_errors(tmp_path: os.PathLike) -> None:
    with pytest.raises(ConfigError, match=r"must end in \.json, \.yaml or \.yml"):
        TrainingConfig.from_file(os.path.join(tmp_path, "cfg.toml"))
    bad = os.path.join(tmp_path, "bad.json")
    with open(bad, "w") as handle:
        handle.write("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        TrainingConfig.from_file(bad)
    listy = os.path.join(tmp_path, "list.yaml")
    with open(listy, "w") as handle:
        handle.write("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        TrainingConfig.from_file(listy)
    unknown = os.path.join(tmp_path, "unknown.yaml")
    with open(unknown, "w") as handle:
        handle.write("fp16: false\nbf16: false\nnum_epoch: 2\n")
    with pytest.raises(ConfigError, match="did you mean 'num_epochs'"):
        TrainingConfig.from_file(unknown)


def test_fingerprint_fields_exclude_only_logging_and_io() -> None:
    cfg = _cfg()
    fields = cfg.fingerprint_fields()
    assert set(cfg.to_dict()) - set(fields) == set(NON_FINGERPRINT_FIELDS)
    assert NON_FINGERPRINT_FIELDS == {"output_dir", "experiment_name", "logging_steps"}
    assert _cfg(output_dir="/elsewhere", experiment_name="x", logging_steps=50).fingerprint_fields() == fields
    assert _cfg(seed=7).fingerprint_fields() != fields
    assert _cfg(eval_strategy="steps", eval_steps=10).fingerprint_fields() != fields
    assert json.loads(json.dumps(fields)) == fields


def test_to_native_kwargs_maps_every_field() -> None:
    cfg = _cfg(bf16=True, lora_target_modules=["encoder"])
    kwargs = cfg.to_native_kwargs()
    assert set(kwargs) == set(cfg.to_dict()) - OWN_FIELDS
    assert OWN_FIELDS == {
        "eval_extraction",
        "eval_threshold",
        "label_order_trials",
        "shuffle_entity_labels",
        "negative_label_prob",
        "synthetic_entity_label_prob",
        "label_subset_prob",
        "label_subset_until",
        "recipe",
        "repair_count_head",
    }
    assert kwargs["lora_target_modules"] == ["encoder"] and isinstance(kwargs["lora_target_modules"], list)
    assert kwargs["fp16"] is False and kwargs["bf16"] is True and kwargs["num_workers"] == 0


def _native_field_names() -> set[str] | None:
    """Field names of gliner2's native TrainingConfig, read from its source without importing it (no torch)."""
    spec = importlib.util.find_spec("gliner2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "training", "trainer.py")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingConfig":
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return None


def test_native_kwargs_are_native_training_config_fields() -> None:
    native = _native_field_names()
    if native is None:
        pytest.skip("gliner2 source is not installed")
    assert set(_cfg().to_native_kwargs()) <= native


def test_a_recipe_sets_the_fields_left_empty_and_a_given_value_wins() -> None:
    from prefect_gliner2.flows.params import TrainingSettings
    from prefect_gliner2.session_core.recipes import RECIPE_FIELDS, RECIPES

    assert set(RECIPE_FIELDS) == {"encoder_lr", "task_lr", "warmup_ratio", "num_epochs"}
    for name, values in RECIPES.items():
        config = _cfg(recipe=name)
        assert {field: getattr(config, field) for field in RECIPE_FIELDS} == dict(values)
        form = TrainingSettings(precision="fp32", recipe=name).to_training_config()  # the run form's empty fields
        assert {field: getattr(form, field) for field in RECIPE_FIELDS} == dict(values)
    assert (_cfg().num_epochs, _cfg(recipe="from-encoder").num_epochs) == (10, 20)
    given = _cfg(recipe="from-encoder", num_epochs=3, task_lr=2e-3)
    assert (given.num_epochs, given.task_lr, given.encoder_lr) == (3, 2e-3, 5e-5)
    # switching recipes moves what followed the old one and keeps what was given
    switched = given.replace(recipe="gliner2")
    assert (switched.num_epochs, switched.task_lr, switched.encoder_lr) == (3, 2e-3, 1e-5)
    assert _cfg(recipe="from-encoder").replace(recipe="gliner2") == _cfg()
    assert TrainingConfig.from_dict(_cfg(recipe="from-encoder").to_dict()).num_epochs == 20
    _rejects("recipe must be one of ['gliner2', 'from-encoder']", recipe="scratch")
    _rejects("num_epochs must be >= 1", num_epochs=0)
