"""The checks of a TrainingConfig's fields: their kinds, explicit precision, refused settings, ranges and choices.

``check_config`` runs at construction (``TrainingConfig.__post_init__``): it normalises the fields (ints given for
floats become floats, a list of targets a tuple, selection defaults resolved) and raises one ConfigError listing
every problem. Torch-free: hardware checks belong to the engine.
"""

from __future__ import annotations

import math
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.metrics import DEFAULT_METRIC, greater_is_better_for, is_extraction_metric

#: The object checked: a TrainingConfig while it is constructed (``config.py`` calls ``check_config`` from
#: ``__post_init__``). This module reads and normalises its fields by name (``FIELD_KINDS``, kept equal to the
#: dataclass's fields by an assertion in config.py) and never imports the class: config imports the checks, one way.
ConfigFields = Any

__all__ = ["EVAL_STRATEGIES", "FIELD_KINDS", "MATMUL_PRECISIONS", "SCHEDULER_TYPES", "check_config"]

SCHEDULER_TYPES = ("linear", "cosine", "cosine_restarts", "constant")
EVAL_STRATEGIES = ("epoch", "steps", "no")
MATMUL_PRECISIONS = ("highest", "high", "medium")

_INT, _FLOAT, _BOOL, _STR, _OPT_INT, _OPT_BOOL, _STR_TUPLE = "int", "float", "bool", "str", "int?", "bool?", "str*"
# fp16/bf16 (bool?) may be None here: the precision check reports None with a better message.
_LABELS = {
    _INT: "an int",
    _FLOAT: "a float",
    _BOOL: "a bool",
    _STR: "a str",
    _OPT_INT: "an int or None",
    _OPT_BOOL: "a bool",
    _STR_TUPLE: "a list of str",
}

#: The kind of every TrainingConfig field (checked against the dataclass when config.py loads).
FIELD_KINDS: dict[str, str] = {
    **dict.fromkeys(
        [
            "num_epochs",
            "max_steps",
            "batch_size",
            "eval_batch_size",
            "gradient_accumulation_steps",
            "warmup_steps",
            "eval_steps",
            "logging_steps",
            "early_stopping_patience",
            "num_workers",
            "seed",
            "length_group_window_batches",
            "lora_r",
            "local_rank",
            "max_train_samples",
            "max_eval_samples",
            "label_order_trials",
        ],
        _INT,
    ),
    **dict.fromkeys(
        [
            "encoder_lr",
            "task_lr",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "max_grad_norm",
            "warmup_ratio",
            "num_cycles",
            "early_stopping_threshold",
            "eval_threshold",
            "gold_injection_start",
            "gold_injection_end",
            "gold_injection_hold_frac",
            "lora_alpha",
            "lora_dropout",
            "negative_label_prob",
            "synthetic_entity_label_prob",
        ],
        _FLOAT,
    ),
    **dict.fromkeys(
        [
            "save_best",
            "greater_is_better",
            "early_stopping",
            "deterministic",
            "validate_data",
            "strict_training",
            "ignore_nonfinite_losses",
            "skip_step_errors",
            "allow_invalid_samples",
            "dedupe_contained_entity_spans",
            "group_by_length",
            "compile_model",
            "gradient_checkpointing",
            "fused_optimizer",
            "allow_tf32",
            "use_lora",
            "lora_use_dora",
            "eval_extraction",
            "shuffle_entity_labels",
            "repair_count_head",
        ],
        _BOOL,
    ),
    **dict.fromkeys(
        [
            "output_dir",
            "experiment_name",
            "scheduler_type",
            "eval_strategy",
            "metric_for_best",
            "on_capacity_exceeded",
            "float32_matmul_precision",
        ],
        _STR,
    ),
    "max_len": _OPT_INT,
    "fp16": _OPT_BOOL,
    "bf16": _OPT_BOOL,
    "lora_target_modules": _STR_TUPLE,
}


def check_config(cfg: ConfigFields) -> None:
    """Normalise `cfg` in place, then raise one ConfigError naming every problem (types first: ranges of values of
    the wrong type would only add noise)."""
    _normalize(cfg)
    problems = _check_types(cfg)
    if not problems:
        problems = _check_precision(cfg) + _check_refusals(cfg) + _check_ranges(cfg) + _check_choices(cfg)
    if problems:
        raise ConfigError(_format_problems(problems))


def _normalize(cfg: ConfigFields) -> None:
    """Store ints given for float fields as floats and a list of targets as a tuple, and resolve the selection
    defaults (no validation)."""
    if cfg.metric_for_best is None:
        extraction = cfg.eval_extraction if isinstance(cfg.eval_extraction, bool) else True
        object.__setattr__(cfg, "metric_for_best", DEFAULT_METRIC if extraction else "eval_loss")
    if cfg.greater_is_better is None and isinstance(cfg.metric_for_best, str):
        object.__setattr__(cfg, "greater_is_better", greater_is_better_for(cfg.metric_for_best))
    for name, kind in FIELD_KINDS.items():
        value = getattr(cfg, name)
        if kind == _FLOAT and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(cfg, name, float(value))
        elif kind == _STR_TUPLE and isinstance(value, list):
            object.__setattr__(cfg, name, tuple(value))


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _FLOAT:
        return isinstance(value, float)
    if kind in (_BOOL, _OPT_BOOL):
        return isinstance(value, bool) or (kind == _OPT_BOOL and value is None)
    if kind == _STR:
        return isinstance(value, str)
    if kind == _OPT_INT:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def _check_types(cfg: ConfigFields) -> list[str]:
    problems = []
    for name, kind in FIELD_KINDS.items():
        value = getattr(cfg, name)
        if not _type_ok(value, kind):
            problems.append(f"{name} must be {_LABELS[kind]}, got {type(value).__name__} {value!r}")
        elif kind == _FLOAT and not math.isfinite(value):
            problems.append(f"{name} must be a finite number, got {value!r}")
    return problems


def _check_precision(cfg: ConfigFields) -> list[str]:
    if cfg.fp16 is None or cfg.bf16 is None:
        return [
            "precision must be explicit: pass fp16=False and bf16=True/False "
            f"(got fp16={cfg.fp16!r}, bf16={cfg.bf16!r}); "
            "implicit precision depends on the architecture natively"
        ]
    if cfg.fp16 and cfg.bf16:
        return ["fp16 and bf16 cannot both be True; pass fp16=False and bf16=True for bf16, or both False for fp32"]
    if cfg.fp16:
        return [
            "fp16=True is not supported by training sessions (GradScaler can silently skip updates); "
            "use bf16=True on CUDA hardware with native bf16, or fp32 (fp16=False, bf16=False)"
        ]
    return []


# (field, refused predicate, message): what was asked and what to do instead.
_REFUSALS: tuple[tuple[str, Any, str], ...] = (
    (
        "num_workers",
        lambda v: v != 0,
        "num_workers must be 0 (preprocessing RNGs are process-global); set num_workers=0",
    ),
    (
        "local_rank",
        lambda v: v != -1,
        "distributed training is not supported (local_rank={v}); run one session per process with local_rank=-1",
    ),
    (
        "compile_model",
        bool,
        "compile_model=True is not supported (graph compilation breaks exact continuation); set compile_model=False",
    ),
    ("skip_step_errors", bool, "skip_step_errors=True would silently drop micro-batches; set skip_step_errors=False"),
    (
        "allow_invalid_samples",
        bool,
        "allow_invalid_samples=True would silently drop samples; set allow_invalid_samples=False and fix the records",
    ),
    (
        "on_capacity_exceeded",
        lambda v: v != "raise",
        "on_capacity_exceeded={v!r} would silently truncate or skip gold targets; set on_capacity_exceeded='raise'",
    ),
    (
        "strict_training",
        lambda v: not v,
        "strict_training=False lets processor errors pass silently; set strict_training=True",
    ),
    (
        "ignore_nonfinite_losses",
        bool,
        "ignore_nonfinite_losses=True would silently skip non-finite losses; set ignore_nonfinite_losses=False",
    ),
    (
        "max_train_samples",
        lambda v: v != -1,
        "max_train_samples={v} would silently drop training data; set it to -1 and pass only the records to train on",
    ),
    (
        "max_eval_samples",
        lambda v: v != -1,
        "max_eval_samples={v} would silently drop validation data; set it to -1 and pass only the records to evaluate",
    ),
)


def _check_refusals(cfg: ConfigFields) -> list[str]:
    return [msg.format(v=getattr(cfg, name)) for name, refused, msg in _REFUSALS if refused(getattr(cfg, name))]


def _check_ranges(cfg: ConfigFields) -> list[str]:
    """Counts, rates, fractions and sizes within their ranges."""
    p: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            p.append(message)

    for name in (
        "num_epochs",
        "batch_size",
        "eval_batch_size",
        "gradient_accumulation_steps",
        "logging_steps",
        "length_group_window_batches",
        "early_stopping_patience",
        "eval_steps",
    ):
        need(getattr(cfg, name) >= 1, f"{name} must be >= 1, got {getattr(cfg, name)}")
    need(
        cfg.max_steps == -1 or cfg.max_steps >= 1,
        f"max_steps must be -1 (derive from num_epochs) or >= 1, got {cfg.max_steps}",
    )
    for name in ("encoder_lr", "task_lr", "weight_decay", "adam_epsilon", "early_stopping_threshold", "num_cycles"):
        need(getattr(cfg, name) >= 0, f"{name} must be >= 0, got {getattr(cfg, name)}")
    need(cfg.warmup_steps >= 0, f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    need(cfg.max_grad_norm > 0, f"max_grad_norm must be > 0, got {cfg.max_grad_norm}")
    for name in ("adam_beta1", "adam_beta2"):
        need(0.0 <= getattr(cfg, name) < 1.0, f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    for name in ("warmup_ratio", "gold_injection_start", "gold_injection_end", "gold_injection_hold_frac"):
        need(0.0 <= getattr(cfg, name) <= 1.0, f"{name} must be in [0, 1], got {getattr(cfg, name)}")
    need(0 <= cfg.seed < 2**32, f"seed must be in [0, 2**32), got {cfg.seed}")
    need(cfg.max_len is None or cfg.max_len >= 1, f"max_len must be None or >= 1, got {cfg.max_len}")
    return p


def _check_choices(cfg: ConfigFields) -> list[str]:
    """Named options among the supported ones, and settings consistent with each other (selection, LoRA)."""
    p: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            p.append(message)

    need(
        cfg.scheduler_type in SCHEDULER_TYPES,
        f"scheduler_type must be one of {list(SCHEDULER_TYPES)}, got {cfg.scheduler_type!r}",
    )
    need(
        cfg.eval_strategy in EVAL_STRATEGIES,
        f"eval_strategy must be one of {list(EVAL_STRATEGIES)}, got {cfg.eval_strategy!r}",
    )
    need(
        cfg.float32_matmul_precision in MATMUL_PRECISIONS,
        f"float32_matmul_precision must be one of {list(MATMUL_PRECISIONS)}, got {cfg.float32_matmul_precision!r}",
    )
    need(bool(cfg.output_dir), "output_dir must be a non-empty path or URL")
    need(bool(cfg.metric_for_best), "metric_for_best must be a non-empty metric name such as 'eval_f1'")
    need(0.0 <= cfg.eval_threshold <= 1.0, f"eval_threshold must be in [0, 1], got {cfg.eval_threshold}")
    need(cfg.label_order_trials >= 1, f"label_order_trials must be >= 1, got {cfg.label_order_trials}")
    for name in ("negative_label_prob", "synthetic_entity_label_prob"):
        need(0.0 <= getattr(cfg, name) <= 1.0, f"{name} must be a probability in [0, 1], got {getattr(cfg, name)}")
    need(
        cfg.eval_extraction or not is_extraction_metric(str(cfg.metric_for_best)),
        f"metric_for_best={cfg.metric_for_best!r} is an extraction metric but eval_extraction=False; "
        "set eval_extraction=True, or metric_for_best='eval_loss' for loss-only validation",
    )
    need(
        not (cfg.early_stopping and cfg.eval_strategy == "no"),
        "early_stopping=True needs validation points but eval_strategy='no'; "
        "set eval_strategy='epoch' or 'steps', or early_stopping=False",
    )
    if cfg.use_lora:
        need(cfg.lora_r >= 1, f"lora_r must be >= 1 when use_lora=True, got {cfg.lora_r}")
        need(cfg.lora_alpha > 0, f"lora_alpha must be > 0 when use_lora=True, got {cfg.lora_alpha}")
        need(
            0.0 <= cfg.lora_dropout < 1.0, f"lora_dropout must be in [0, 1) when use_lora=True, got {cfg.lora_dropout}"
        )
        need(
            bool(cfg.lora_target_modules),
            "lora_target_modules cannot be empty when use_lora=True; name at least one module group",
        )
        need(all(cfg.lora_target_modules), "lora_target_modules entries must be non-empty module names")
    return p


def _format_problems(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid TrainingConfig: {problems[0]}"
    return "invalid TrainingConfig:\n  - " + "\n  - ".join(problems)
