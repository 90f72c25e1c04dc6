"""Training configuration: a frozen, validated, serializable mirror of gliner2's native TrainingConfig.

Validation happens at construction, before anything is allocated, and never imports torch: hardware
checks (is bf16 native on this GPU?) belong to the engine, so a CPU-only control plane can plan a CUDA run.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec

from prefect_gliner2.session_core.config_checks import FIELD_KINDS, check_config
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.metrics import DEFAULT_METRIC, greater_is_better_for
from prefect_gliner2.session_core.recipes import DEFAULT_RECIPE, RECIPE_FIELDS, RECIPES

__all__ = ["DEFAULT_LORA_TARGET_MODULES", "NON_FINGERPRINT_FIELDS", "OWN_FIELDS", "TrainingConfig", "read_config_file"]

DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = ("encoder", "span_rep", "classifier", "count_embed", "count_pred")

# Our own fields: not part of gliner2's native TrainingConfig.
OWN_FIELDS: frozenset[str] = frozenset(
    {
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
)

# Fields that change neither the batch schedule nor the numerics: excluded from fingerprint_fields().
NON_FINGERPRINT_FIELDS: frozenset[str] = frozenset({"output_dir", "experiment_name", "logging_steps"})


@dataclass(frozen=True)
class TrainingConfig:
    """Everything a managed GLiNER2 training run needs to know, validated when built.

    Field names and meanings follow gliner2 2.1's native ``TrainingConfig`` (see ``to_native_kwargs``).
    Defaults are the native ones except where exact, resumable training needs otherwise:

    - ``fp16`` / ``bf16`` default to ``None`` and must both be given: implicit precision is architecture
      dependent natively (fp16 for span, bf16 for boundary). ``fp16=True`` is always refused (GradScaler
      silently skips updates); ``bf16=True`` is accepted here and checked against the hardware by the engine.
    - ``num_workers=0`` (required: preprocessing RNGs are process-global); ``eval_strategy="epoch"``.
    - ``deterministic=True``, ``allow_tf32=False``, ``float32_matmul_precision="highest"``: bitwise-equal
      continuation needs deterministic kernels and true FP32 matmuls (native: False / True / "high").
    - ``lora_target_modules`` is a tuple (a list is accepted and converted).
    - Selection follows the quality of the model a run ships: ``metric_for_best`` defaults to ``"eval_f1_fitted"``
      (micro F1 at the thresholds fitted on that validation, which the export records; ``"eval_loss"`` when
      ``eval_extraction=False``) and ``greater_is_better`` to the metric's direction (higher for precision, recall
      and F1, lower for losses); explicit values are kept.

    Our own fields (not passed to gliner2's config): ``eval_extraction`` (validation also extracts with gliner2's
    batched inference and scores precision/recall/F1; default True) and ``eval_threshold`` (the span threshold of
    that inference, in [0, 1], default gliner2's 0.5); ``label_order_trials`` (validation asks each record's labels
    in that many seeded random orders and reports the spread; the first order gives ``eval_f1``; default 3). Each
    validation also extracts once at the threshold fit's floor and reports ``eval_f1_fitted`` and
    ``eval_macro_f1_fitted`` at the thresholds fitted on it (``fitted_scores.py``).

    Augmentation, so that a model does not tie a label to its place in the prompt (on by default; deterministic: it
    draws from the session's checkpointed preprocessing stream or from the plan's seed, epoch and record position):
    ``shuffle_entity_labels`` (gliner2's ``SamplingConfig.shuffle_entities``: each occurrence's entity labels in a
    random order), ``negative_label_prob`` (each entity label of the training data that a record does not list is
    asked with an empty answer with this probability, so the model learns to say "none"), and
    ``synthetic_entity_label_prob`` (gliner2's: a record's labels replaced by "entity 1..n"; gliner2's default 0.2).
    So that shuffling does not erase which label is which (augment.py says why it can): during the first
    ``label_subset_until`` fraction of the epochs (default 0.5), each record asking two or more entity labels is asked
    a random proper subset of them, with probability ``label_subset_prob`` (default 0.5; 0 turns it off). 0.5 was
    chosen by measurement: the two-label case of issue 43 reaches F1 1.000 in every label order on both tiny encoders
    at 0.5 and at 1.0, and the demo's held-out micro F1 over 8 orders is 0.963-0.972 at 0.5, 0.926-0.935 at 1.0 and
    0.951-0.965 at 0 (its weakest label, person, 0.928 / 0.853 / 0.894;
    ``bench/demo_variants.py``).

    ``recipe`` (``session_core.recipes``): ``"gliner2"`` (default) to continue training a trained GLiNER2 model,
    ``"from-encoder"`` for a model ``prefect-gliner2 init-model`` built on a pretrained encoder (fresh heads). It sets
    ``encoder_lr``, ``task_lr``, ``warmup_ratio`` and ``num_epochs`` unless they are given (``None`` means "the
    recipe's"; ``num_epochs`` is 10 for ``"gliner2"``, 20 for ``"from-encoder"``).

    ``repair_count_head``: the pre-flight before training (``runtime.preflight``) stops a span model whose count head
    predicts 0 for every label (it would extract nothing); True pins that head to one instance per label instead
    (what ``prefect-gliner2 init-model`` does). Default False.

    Refused outright (the session never drops data, changes precision or skips an update silently):
    fp16, distributed training (``local_rank != -1``), ``compile_model``, ``skip_step_errors``,
    ``allow_invalid_samples``, ``on_capacity_exceeded != "raise"``, ``strict_training=False``,
    ``ignore_nonfinite_losses``, ``max_train_samples`` / ``max_eval_samples`` other than -1, and
    ``early_stopping`` without any validation point (``eval_strategy="no"``).

    Ranges: counts (``batch_size``, ``eval_batch_size``, ``gradient_accumulation_steps``, ``num_epochs``,
    ``logging_steps``, ``length_group_window_batches``, ``early_stopping_patience``) are >= 1; ``max_steps``
    is -1 (derive from epochs) or >= 1, and when > 0 it decides the number of epochs as natively;
    ``eval_steps`` >= 1; learning rates, weight decay, epsilon, warmup and thresholds >= 0;
    ``max_grad_norm`` > 0; betas in [0, 1); ``warmup_ratio`` and ``gold_injection_*`` in [0, 1];
    ``seed`` in [0, 2**32) (NumPy's seed range); ``max_len`` None or >= 1; with ``use_lora``:
    ``lora_r`` >= 1, ``lora_alpha`` > 0, ``lora_dropout`` in [0, 1), non-empty targets. Floats must be
    finite; ints given for float fields are stored as floats so serialized configs compare equal.
    """

    output_dir: str = "./output"
    experiment_name: str = "gliner2"
    num_epochs: int | None = None  # resolved from the recipe: 10 for "gliner2", 20 for "from-encoder"
    max_steps: int = -1
    batch_size: int = 2
    eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    encoder_lr: float | None = None  # resolved from the recipe: 1e-5 for "gliner2"
    task_lr: float | None = None  # resolved from the recipe: 5e-4 for "gliner2"
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    scheduler_type: str = "linear"
    warmup_ratio: float | None = None  # resolved from the recipe: 0.1
    warmup_steps: int = 0
    num_cycles: float = 0.5
    fp16: bool | None = None
    bf16: bool | None = None
    eval_strategy: str = "epoch"
    eval_steps: int = 500
    save_best: bool = True
    metric_for_best: str | None = None  # resolved: "eval_f1_fitted", or "eval_loss" without eval_extraction
    greater_is_better: bool | None = None  # resolved from metric_for_best's direction
    logging_steps: int = 1
    early_stopping: bool = False
    early_stopping_patience: int = 3
    early_stopping_threshold: float = 0.0
    num_workers: int = 0
    seed: int = 42
    deterministic: bool = True
    max_len: int | None = None
    validate_data: bool = True
    strict_training: bool = True
    ignore_nonfinite_losses: bool = False
    skip_step_errors: bool = False
    allow_invalid_samples: bool = False
    gold_injection_start: float = 1.0
    gold_injection_end: float = 0.25
    gold_injection_hold_frac: float = 0.15
    on_capacity_exceeded: str = "raise"
    dedupe_contained_entity_spans: bool = True
    group_by_length: bool = True
    length_group_window_batches: int = 50
    compile_model: bool = False
    gradient_checkpointing: bool = False
    fused_optimizer: bool = True
    allow_tf32: bool = False
    float32_matmul_precision: str = "highest"
    use_lora: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_use_dora: bool = False
    lora_target_modules: tuple[str, ...] = field(default=DEFAULT_LORA_TARGET_MODULES)
    local_rank: int = -1
    max_train_samples: int = -1
    max_eval_samples: int = -1
    eval_extraction: bool = True
    eval_threshold: float = 0.5
    label_order_trials: int = 3
    shuffle_entity_labels: bool = True
    negative_label_prob: float = 0.5
    synthetic_entity_label_prob: float = 0.2
    label_subset_prob: float = 0.5
    label_subset_until: float = 0.5
    recipe: str = DEFAULT_RECIPE
    repair_count_head: bool = False

    def __post_init__(self) -> None:
        check_config(self)  # normalises, then raises one ConfigError listing every problem

    # ----------------------------------------------------------------- serialization

    def to_dict(self) -> dict[str, Any]:
        """All fields as JSON-ready values (``lora_target_modules`` becomes a list)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["lora_target_modules"] = list(self.lora_target_modules)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingConfig:
        """Build from a mapping; every unknown key is reported (with close matches), none ignored."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"a training config must be a mapping of field names to values, got {type(data).__name__}"
            )
        _reject_unknown(data.keys(), "config")
        return cls(**dict(data))

    @classmethod
    def from_file(cls, path_or_url: str | os.PathLike[str]) -> TrainingConfig:
        """Read a ``.json``, ``.yaml`` or ``.yml`` file from a local path or any fsspec URL."""
        return cls.from_dict(read_config_file(path_or_url))

    def replace(self, **changes: Any) -> TrainingConfig:
        """A copy with ``changes`` applied and everything validated again."""
        _reject_unknown(changes.keys(), "replace()")
        changes = dict(changes)
        if "metric_for_best" not in changes and "eval_extraction" in changes:
            if self.metric_for_best == (DEFAULT_METRIC if self.eval_extraction else "eval_loss"):
                changes["metric_for_best"] = None  # a defaulted metric follows eval_extraction
        if "recipe" in changes and changes["recipe"] in RECIPES:
            for name in RECIPE_FIELDS:  # a field the old recipe set follows the new recipe
                if name not in changes and getattr(self, name) == RECIPES[self.recipe][name]:
                    changes[name] = None
        if "greater_is_better" not in changes and "metric_for_best" in changes:
            if self.greater_is_better == greater_is_better_for(str(self.metric_for_best)):
                changes["greater_is_better"] = None  # a defaulted direction follows the metric
        return dataclasses.replace(self, **changes)

    def to_native_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for gliner2's native ``TrainingConfig`` (fields we do not expose keep native defaults)."""
        kwargs = {name: getattr(self, name) for name in _NATIVE_FIELDS if name not in OWN_FIELDS}
        kwargs["lora_target_modules"] = list(self.lora_target_modules)
        return kwargs

    def fingerprint_fields(self) -> dict[str, Any]:
        """The fields that change the schedule or the numerics (all but pure logging/IO fields)."""
        return {k: v for k, v in self.to_dict().items() if k not in NON_FINGERPRINT_FIELDS}

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps


_NATIVE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainingConfig))
_FIELD_NAMES: frozenset[str] = frozenset(_NATIVE_FIELDS)
assert _FIELD_NAMES == frozenset(FIELD_KINDS), "every TrainingConfig field needs a kind (config_checks.FIELD_KINDS)"


def read_config_file(path_or_url: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping of field names to values in a ``.json``, ``.yaml`` or ``.yml`` config file (path or fsspec URL),
    not yet checked as a TrainingConfig."""
    uri = os.fspath(path_or_url)
    suffix = uri.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower() if "." in uri.rsplit("/", 1)[-1] else ""
    if suffix not in ("json", "yaml", "yml"):
        raise ConfigError(f"config file {uri!r} must end in .json, .yaml or .yml (got {suffix or 'no extension'!r})")
    try:
        with fsspec.open(uri, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"config file {uri!r} cannot be read ({reason}); pass a JSON or YAML file of TrainingConfig fields"
        ) from exc
    data = _parse_config_text(text, uri, suffix)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {uri!r} must hold a mapping of field names to values, got {type(data).__name__}"
        )
    return dict(data)


def _parse_config_text(text: str, uri: str, suffix: str) -> Any:
    if suffix == "json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"config file {uri!r} is not valid JSON: {exc}; fix the file") from exc
    import yaml  # type: ignore[import-untyped]

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {uri!r} is not valid YAML: {exc}; fix the file") from exc


def _reject_unknown(names: Any, where: str) -> None:
    unknown = sorted(str(n) for n in names if n not in _FIELD_NAMES)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(_FIELD_NAMES), n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ConfigError(f"unknown TrainingConfig field(s) in {where}: {', '.join(hints)}; remove or rename them")
