"""The training flows' config parameter: a pydantic model designed for the Prefect run form.

``TrainingSettings`` is what the form shows and what the server validates: the settings people choose (precision
as a choice of ``fp32`` / ``bf16``, epochs, batch size, learning rates, validation, LoRA) with descriptions,
choices and ranges, plus an ``advanced`` section with the rest of the native options the session accepts. Fields
the session refuses or fixes (``fp16``, ``num_workers``, ``local_rank``, ``compile_model``, ``skip_step_errors``,
``allow_invalid_samples``, ``on_capacity_exceeded``, ``strict_training``, ``ignore_nonfinite_losses``,
``max_train_samples``, ``max_eval_samples``, ``output_dir``) are not offered.

From Python a flat mapping of ``TrainingConfig`` fields (``{"fp16": False, "bf16": False, ...}``) or a
``TrainingConfig`` is accepted too; it is checked by ``TrainingConfig`` itself, so every refusal carries the same
message as everywhere else. ``to_training_config`` is the one conversion to ``session_core.TrainingConfig``;
``check_runnable`` refuses, before any task runs, what the schema cannot express (bf16 on CPU, early stopping
without validation).

The training flow's other settings are grouped the same way, one section of the form each: ``CheckpointSettings``
(when checkpoints are taken, how many are kept, how they are written), ``ExecutionSettings`` (how the plan's batches
become Prefect tasks, and where the worker trains) and ``LeaseSettings`` (the run key's lease). None of them changes
the numbers a run trains to. The data files' format and its settings are ``flows.data_params.DataSettings``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from prefect_gliner2.runtime.lease import DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT
from prefect_gliner2.runtime.run import DEFAULT_KEEP_CHECKPOINTS
from prefect_gliner2.runtime.schedule import (
    AUTO,
    AUTO_CHECKPOINT_UPDATES,
    AUTO_PIPELINE_DEPTH,
    MIN_CHECKPOINT_SECONDS,
    TARGET_TASK_SECONDS,
)
from prefect_gliner2.session_core import TrainingConfig
from prefect_gliner2.session_core.config import DEFAULT_LORA_TARGET_MODULES
from prefect_gliner2.session_core.errors import (
    BF16_NEEDS_CUDA,
    EARLY_STOPPING_NEEDS_VALIDATION,
    ConfigError,
    PrecisionError,
)
from prefect_gliner2.session_core.metrics import EVAL_KEYS, greater_is_better_for

__all__ = [
    "FIXED_FIELDS",
    "METRICS",
    "AdvancedSettings",
    "CheckpointSettings",
    "ExecutionSettings",
    "LeaseSettings",
    "TrainingSettings",
    "check_runnable",
]

# The validation metrics the managed driver computes (session_core.metrics), plus "auto" (the config's default).
METRICS = EVAL_KEYS
Metric = Literal[
    "auto",
    "eval_f1",
    "eval_precision",
    "eval_recall",
    "eval_entity_f1",
    "eval_relation_f1",
    "eval_classification_f1",
    "eval_structure_f1",
    "eval_macro_f1",
    "eval_f1_order_min",
    "eval_f1_order_max",
    "eval_f1_canonical",
    "eval_f1_fitted",
    "eval_macro_f1_fitted",
    "eval_loss",
    "eval_classification_loss",
    "eval_structure_loss",
    "eval_count_loss",
]
assert set(get_args(Metric)) == {"auto", *EVAL_KEYS}, "the form offers every metric validation computes"

# TrainingConfig fields the form does not offer: refused, fixed to the one accepted value, or meaningless here.
FIXED_FIELDS: frozenset[str] = frozenset(
    {
        "fp16",
        "bf16",
        "greater_is_better",  # follows metric_for_best: higher for precision/recall/F1, lower for losses
        "output_dir",
        "num_workers",
        "local_rank",
        "compile_model",
        "skip_step_errors",
        "allow_invalid_samples",
        "on_capacity_exceeded",
        "strict_training",
        "ignore_nonfinite_losses",
        "max_train_samples",
        "max_eval_samples",
    }
)

DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]+)?)$"
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegative = Annotated[float, Field(ge=0.0)]


class _Form(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdvancedSettings(_Form):
    """The rest of the native options the session accepts; the defaults suit most runs."""

    eval_batch_size: int = Field(default=8, ge=1, description="Records per validation batch.")
    weight_decay: NonNegative = Field(default=0.01, description="AdamW weight decay.")
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="AdamW beta1, in [0, 1).")
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0, description="AdamW beta2, in [0, 1).")
    adam_epsilon: NonNegative = Field(default=1e-8, description="AdamW epsilon.")
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="Gradient clipping norm.")
    warmup_steps: int = Field(default=0, ge=0, description="Warm-up updates; a positive value replaces warmup_ratio.")
    num_cycles: NonNegative = Field(default=0.5, description="Cycles of the cosine schedules.")
    early_stopping_threshold: NonNegative = Field(
        default=0.0, description="Smallest improvement of the metric that resets early stopping's patience."
    )
    max_len: int | None = Field(
        default=None, ge=1, description="Truncate inputs to this many tokens (empty: no limit)."
    )
    validate_data: bool = Field(default=True, description="Check every record against the schema before training.")
    deterministic: bool = Field(default=True, description="Deterministic kernels (needed for bit-exact continuation).")
    allow_tf32: bool = Field(default=False, description="Allow TF32 matmuls on CUDA (changes fp32 numerics).")
    float32_matmul_precision: Literal["highest", "high", "medium"] = Field(
        default="highest", description="torch.set_float32_matmul_precision for fp32 runs."
    )
    gradient_checkpointing: bool = Field(default=False, description="Trade compute for activation memory.")
    fused_optimizer: bool = Field(default=True, description="Use the fused AdamW kernel where available.")
    group_by_length: bool = Field(default=True, description="Batch records of similar length together.")
    length_group_window_batches: int = Field(
        default=50, ge=1, description="Batches per window when grouping by length."
    )
    dedupe_contained_entity_spans: bool = Field(
        default=True, description="Drop entity spans contained in another gold span."
    )
    gold_injection_start: Fraction = Field(
        default=1.0, description="Boundary models: gold injection rate at the start."
    )
    gold_injection_end: Fraction = Field(default=0.25, description="Boundary models: gold injection rate at the end.")
    gold_injection_hold_frac: Fraction = Field(
        default=0.15, description="Boundary models: fraction of training that holds the start rate."
    )
    lora_use_dora: bool = Field(default=False, description="LoRA: use DoRA (weight-decomposed) adapters.")
    lora_target_modules: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGET_MODULES),
        min_length=1,
        description="LoRA: module groups that get adapters.",
    )
    experiment_name: str = Field(default="gliner2", min_length=1, description="A name recorded with the run.")
    logging_steps: int = Field(default=1, ge=1, description="Report training loss every N optimizer updates.")


_ADVANCED = frozenset(AdvancedSettings.model_fields)


class TrainingSettings(_Form):
    """Training settings of one run. Everything the session would refuse is refused here, before a run starts."""

    # The server checks this cross-field rule too (JSON schema if/then), before a flow run is created.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"early_stopping": {"const": True}}, "required": ["early_stopping"]},
            "then": {"properties": {"eval_strategy": {"enum": ["epoch", "steps"]}}},
        }
    )

    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="fp32 everywhere, or bf16 on CUDA GPUs with native bf16 (fp16 is not supported)."
    )
    num_epochs: int | None = Field(
        default=None,
        ge=1,
        description="Passes over the training data (empty: the recipe's; 10 for gliner2, 20 for from-encoder; "
        "max_steps, when set, decides).",
    )
    max_steps: int = Field(
        default=-1,
        ge=-1,
        json_schema_extra={"not": {"const": 0}},
        description="Stop after this many optimizer updates; -1: derive from epochs.",
    )
    batch_size: int = Field(default=2, ge=1, description="Records per micro-batch.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer update.")
    recipe: Literal["gliner2", "from-encoder"] = Field(
        default="gliner2",
        description="gliner2: continue training a trained GLiNER2 model; from-encoder: a model built by init-model "
        "on a pretrained encoder (fresh heads: the encoder at 5e-5, the heads at 1e-3, 20 epochs). Sets the "
        "learning rates, warmup and epochs left empty.",
    )
    encoder_lr: NonNegative | None = Field(
        default=None, description="Learning rate of the encoder (empty: the recipe's; 1e-5 for gliner2)."
    )
    task_lr: NonNegative | None = Field(
        default=None, description="Learning rate of the task heads (empty: the recipe's; 5e-4 for gliner2)."
    )
    scheduler_type: Literal["linear", "cosine", "cosine_restarts", "constant"] = Field(
        default="linear", description="Learning-rate schedule."
    )
    warmup_ratio: Fraction | None = Field(
        default=None, description="Fraction of updates spent warming up the learning rate (empty: the recipe's; 0.1)."
    )
    eval_strategy: Literal["epoch", "steps", "no"] = Field(
        default="epoch",
        description="When to validate (needs valid_data): every epoch, every eval_steps updates, or never.",
    )
    eval_steps: int = Field(default=500, ge=1, description="Validate every N updates when eval_strategy is steps.")
    eval_extraction: bool = Field(
        default=True,
        description="Validation also extracts with the live model and scores precision, recall and F1 per label.",
    )
    eval_threshold: Fraction = Field(default=0.5, description="Span threshold of validation's extraction.")
    label_order_trials: int = Field(
        default=3,
        ge=1,
        description="Validation asks each record's labels in this many seeded random orders, as users' code would, "
        "and reports the lowest and highest F1 (eval_f1_order_min/max); eval_f1 is the first order's, "
        "eval_f1_canonical the data's own order's.",
    )
    shuffle_entity_labels: bool = Field(
        default=True,
        description="Train with each record's entity labels in a random order (gliner2's shuffle_entities), so the "
        "model does not tie a label to its place in the prompt.",
    )
    negative_label_prob: Fraction = Field(
        default=0.5,
        description="Probability that each label of the training data a record does not list is asked of it with an "
        "empty answer, so the model learns to answer none (deterministic from seed, epoch and record).",
    )
    synthetic_entity_label_prob: Fraction = Field(
        default=0.2,
        description="Probability that a record's entity labels are replaced by 'entity 1..n' while training "
        "(gliner2's own augmentation; its default 0.2).",
    )
    label_subset_prob: Fraction = Field(
        default=0.5,
        description="Early in training, probability that a record is asked only some of its entity labels, so that "
        "shuffled label orders do not erase which label is which (the marker before each label name must learn to "
        "carry that name); 0 turns it off.",
    )
    label_subset_until: Fraction = Field(
        default=0.5,
        description="Fraction of the epochs (the first ones) during which label_subset_prob applies.",
    )
    repair_count_head: bool = Field(
        default=False,
        description="Before training, a span model whose count head predicts 0 for every label (it would extract "
        "nothing: gliner2 does not train that head on entity tasks) stops the run; on, the head is pinned to one "
        "instance per label instead, as `prefect-gliner2 init-model` builds it.",
    )
    metric_for_best: Metric = Field(
        default="auto",
        description="Validation metric that selects the best model and drives early stopping; auto is "
        "eval_f1_fitted, the F1 at the thresholds fitted on that validation, which the export ships (eval_loss when "
        "eval_extraction is off). Higher is better for precision, recall and F1, lower for losses.",
    )
    save_best: bool = Field(default=True, description="Keep the best validation model and export it.")
    early_stopping: bool = Field(default=False, description="Stop when the metric stops improving (needs validation).")
    early_stopping_patience: int = Field(
        default=3, ge=1, description="Validations without improvement before stopping."
    )
    seed: int = Field(default=42, ge=0, lt=2**32, description="Seed of shuffling, dropout and initialisation.")
    use_lora: bool = Field(default=False, description="Train one LoRA adapter instead of all weights.")
    lora_r: int = Field(default=16, ge=1, description="LoRA rank.")
    lora_alpha: float = Field(default=32.0, gt=0.0, description="LoRA alpha (scaling).")
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="LoRA dropout, in [0, 1).")
    advanced: AdvancedSettings = Field(
        default_factory=lambda: AdvancedSettings(), description="Further native options."
    )
    _config: TrainingConfig | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _accept_training_config_fields(cls, data: Any) -> Any:
        if isinstance(data, TrainingConfig):
            return _from_training_config(data)
        if isinstance(data, Mapping) and _is_flat(data):
            return _from_training_config(_flat_training_config(data))
        return data

    @model_validator(mode="after")
    def _validate_with_training_config(self) -> TrainingSettings:
        names = [name for name in type(self).model_fields if name not in ("precision", "advanced")]
        values = {name: getattr(self, name) for name in names}
        if values.get("metric_for_best") == "auto":
            values["metric_for_best"] = None  # the config's default: eval_f1_fitted, or eval_loss without extraction
        try:
            self._config = TrainingConfig(
                **values, **self.advanced.model_dump(), fp16=False, bf16=self.precision == "bf16"
            )
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    def to_training_config(self) -> TrainingConfig:
        """The session's TrainingConfig, built once when these settings were validated (precision explicit)."""
        assert self._config is not None, "TrainingSettings are always validated"
        return self._config


def _is_flat(data: Mapping[str, Any]) -> bool:
    """A mapping of TrainingConfig field names (``fp16``/``bf16`` and advanced options at the top level)."""
    return "precision" not in data and "advanced" not in data and any(k in FIXED_FIELDS or k in _ADVANCED for k in data)


def _flat_training_config(data: Mapping[str, Any]) -> TrainingConfig:
    """Check a flat mapping with TrainingConfig's own messages; fp16/bf16 default to False like the form."""
    values = {"fp16": False, "bf16": False, **data} if "fp16" not in data and "bf16" not in data else dict(data)
    try:
        return TrainingConfig.from_dict(values)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _from_training_config(config: TrainingConfig) -> dict[str, Any]:
    defaults = TrainingConfig(fp16=False, bf16=False)
    if config.output_dir != defaults.output_dir:
        raise ValueError(
            f"output_dir={config.output_dir!r} is not used by training flows (a run lives in STORAGE/RUN_KEY and "
            "exports to export_to); remove output_dir from the config"
        )
    if config.greater_is_better != greater_is_better_for(str(config.metric_for_best)):
        raise ValueError(
            f"greater_is_better={config.greater_is_better} contradicts metric_for_best={config.metric_for_best!r} "
            "(higher is better for precision, recall and F1, lower for losses); leave greater_is_better unset"
        )
    values = config.to_dict()
    form = {k: v for k, v in values.items() if k not in FIXED_FIELDS and k not in _ADVANCED}
    return {
        **form,
        "precision": "bf16" if config.bf16 else "fp32",
        "advanced": {k: v for k, v in values.items() if k in _ADVANCED},
    }


assert _ADVANCED | frozenset(TrainingSettings.model_fields) | FIXED_FIELDS >= {
    f.name for f in dataclasses.fields(TrainingConfig)
}, "every TrainingConfig field is offered on the form or listed as fixed"


def check_runnable(config: TrainingConfig, has_validation: bool, device: str | None) -> None:
    """Refuse, before any task runs, what the worker would refuse for a configuration reason the form's schema
    cannot express (same messages as the session's own refusals)."""
    if config.early_stopping and not has_validation:
        raise ConfigError(EARLY_STOPPING_NEEDS_VALIDATION)
    if config.bf16 and device == "cpu":
        raise PrecisionError(BF16_NEEDS_CUDA)


# ---- the training flow's run settings (how a run executes, never what it trains to) ---------------------------


class CheckpointSettings(_Form):
    """When checkpoints are taken, how many are kept and how they are written."""

    checkpoint_every: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default=AUTO,
        description=f"Checkpoint after every N optimizer updates (0: only at epoch ends); every epoch end always. "
        f"auto: every {AUTO_CHECKPOINT_UPDATES} updates, fewer when steps are short, so that checkpoints are at "
        f"least {MIN_CHECKPOINT_SECONDS:g} s of training apart (a kill loses at most about that much).",
    )
    keep_checkpoints: int | None = Field(
        default=DEFAULT_KEEP_CHECKPOINTS,
        ge=1,
        description="Keep the newest N checkpoints (plus the one taken at the best validation step and the one the "
        "cursor names); older ones are deleted once a newer checkpoint is committed. Empty keeps all.",
    )
    background_checkpoints: bool = Field(
        default=False,
        description="Write checkpoints while training continues: costs one checkpoint's size of extra host RAM "
        "while a write is in flight. The cursor moves once a checkpoint is written; results are the same.",
    )


class ExecutionSettings(_Form):
    """How the plan's batches become Prefect tasks, and where the session worker trains."""

    batches_per_task: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default=AUTO,
        description=f"Batches per Prefect task. auto: start at 1 and grow as batches are timed, so that a task "
        f"trains for about {TARGET_TASK_SECONDS:g} s and Prefect's cost per task is noise; it never changes what is "
        "trained. A number pins it.",
    )
    pipeline_depth: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        default=AUTO,
        description=f"Operations sent to the worker ahead of their task, so it trains while Prefect records the "
        f"previous one (0: none; auto: {AUTO_PIPELINE_DEPTH}).",
    )
    device: str | None = Field(
        default=None, pattern=DEVICE_PATTERN, description='"cpu", "cuda" or "cuda:N" (empty: CUDA when available).'
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        description="Torch threads in the worker (recorded on first use; empty: this worker slot's share of the "
        "CPUs: $PREFECT_GLINER2_CPU_THREADS, else $OMP_NUM_THREADS, else usable CPUs divided by "
        "$PREFECT_GLINER2_WORKER_SLOTS).",
    )


class LeaseSettings(_Form):
    """The run key's lease: one live run per run key."""

    lease_ttl: float = Field(
        default=DEFAULT_LEASE_TTL,
        ge=1,
        description="Seconds a remote-storage lease lives without a heartbeat (the holder renews it every ttl/3).",
    )
    lease_wait: float = Field(
        default=DEFAULT_LEASE_WAIT,
        ge=0,
        description="Seconds to wait for a run key held by another live run before failing. A lease of this same "
        "flow run, of a process gone from this host, or of a flow run that Prefect reports final or CRASHED is "
        "taken over at once.",
    )
