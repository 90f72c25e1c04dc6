"""The engine adapter: the only module that touches gliner2's native trainer internals.

`SessionEngine` subclasses gliner2's `ExtractorTrainer` and drives its own methods one bounded operation at a
time: `_backward_one` for a micro-batch, `_renormalize_partial_accumulation` + `_optimizer_step` for an update,
`_create_optimizer` and `get_scheduler` for the optimizer and schedule, `ExtractorCollator` for preprocessing. It
never calls `train()`, `_prepare_data`, `_create_dataloader`, `_evaluate`, `_save_checkpoint` or
`load_checkpoint` (they reseed global RNGs, reorder data, write files, or perturb live weights).

What this adapter adds, because the native engine lacks it:
- an explicit device and precision (no CPU AMP downgrade, no fp16, bf16 only when hardware-native);
- no files written and no logging reconfigured at construction;
- non-reentrant activation checkpointing;
- preloaded PEFT adapters validated against the configuration and continued without re-initialisation;
- guards: a sample the span model could not process, a missing loss, a loss that does not require grad while
  parameters are trainable, a non-finite loss, and non-finite gradients all raise instead of being zeroed (the
  gradient guard reads the norm native clipping computes anyway: no second pass over the gradients);
- the boundary head's schedule scalars re-applied from the counters (they are not in `state_dict`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gliner2.training.trainer import ExtractorCollator, ExtractorTrainer, get_scheduler
from gliner2.training.trainer import TrainingConfig as NativeTrainingConfig

from prefect_gliner2.session_core.errors import (
    BF16_NEEDS_CUDA,
    AdapterMismatchError,
    ConfigError,
    PrecisionError,
    RecordError,
    TrainingNumericsError,
)

logger = logging.getLogger(__name__)

Pair = tuple[str, dict[str, Any]]


def resolve_device(requested: str | None, bf16: bool) -> torch.device:
    """Pick the session device and check that the requested precision is hardware-native there."""
    device = torch.device(requested) if requested else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type not in ("cpu", "cuda"):
        raise PrecisionError(f"device {device} is not supported; use 'cpu' or 'cuda'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PrecisionError("device 'cuda' was requested but CUDA is not available; pass device='cpu'")
    if bf16:
        if device.type != "cuda":
            raise PrecisionError(BF16_NEEDS_CUDA)
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            raise PrecisionError(
                f"bf16=True but {torch.cuda.get_device_name(device)} has no hardware-native bf16 "
                "(emulated bf16 is refused); pass bf16=False to train in fp32."
            )
    return device


def configure_determinism(device: torch.device, bf16: bool) -> None:
    """Process-wide numerics for exact training: no TF32 in fp32, deterministic CUDA kernels."""
    if not bf16:
        torch.set_float32_matmul_precision("highest")
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)


def native_config(kwargs: dict[str, Any], device: torch.device) -> NativeTrainingConfig:
    """Build the native config with explicit precision; fp32 always disables TF32."""
    values = dict(kwargs)
    values["fp16"] = False
    if not values.get("bf16"):
        values["allow_tf32"] = False
        values["float32_matmul_precision"] = "highest"
    values["num_workers"] = 0
    values["report_to_wandb"] = False
    # Checkpointing is enabled by the engine itself, non-reentrant (see SessionEngine._enable_checkpointing).
    values["gradient_checkpointing"] = False
    values["pin_memory"] = False
    if values.get("bf16") and device.type != "cuda":  # resolve_device already refused this; keep torch quiet
        raise PrecisionError("bf16 requires CUDA")
    try:
        return NativeTrainingConfig(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"gliner2 rejected the training configuration: {exc}") from exc


def unwrap(model: torch.nn.Module) -> Any:
    """The gliner2 extractor inside a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_peft(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


class SessionEngine(ExtractorTrainer):
    """gliner2's native trainer, driven one bounded operation at a time (see module docstring)."""

    _finite_grad_hook_handles: list[Any]

    def __init__(
        self,
        model: torch.nn.Module,
        config: NativeTrainingConfig,
        *,
        device: torch.device,
        gradient_checkpointing: bool = False,
    ) -> None:
        self._session_device = device
        self._preloaded_adapter = is_peft(model)
        self._guard_active = False
        super().__init__(model, config)
        if gradient_checkpointing:
            self._enable_checkpointing()
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self._trainable:
            raise ConfigError("the model has no trainable parameters; check use_lora/lora_target_modules")
        self._guard_handle = unwrap(self.model).register_forward_hook(self._guard_outputs)
        self.use_amp = bool(config.bf16)
        self.amp_dtype = torch.bfloat16 if config.bf16 else torch.float32
        model_config = self._get_model_config()
        self.max_len = config.max_len or getattr(model_config, "max_len", None)
        boundary = getattr(model_config, "boundary_head", None) or {}
        self.max_gold = boundary.get("max_gold_per_query", 32) if isinstance(boundary, dict) else 32
        self.train_collator = self._collator(is_training=True)
        self.eval_collator = self._collator(is_training=False)

    # ---- native hooks overridden -------------------------------------------------------------------------

    def _setup_seed(self) -> None:
        seed = self.config.seed
        # gliner2's preprocessing draws from the `random` module; a session gets its own stream, seeded as native
        # train() seeds the global one, so that no other thread of the process (Prefect's services use `random`)
        # can shift it. `private_python_rng` routes the processor to it during this session's operations.
        self.python_rng = random.Random(seed)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        torch.backends.cudnn.benchmark = False

    def _setup_device(self) -> None:
        self.device = self._session_device
        self.is_distributed = False
        self.model.to(self.device)
        if not self.config.bf16:
            self.model.float()

    def _setup_output_dir(self) -> None:
        self.output_dir = Path(self.config.output_dir)
        self.logs_dir = self.output_dir / "logs"

    def _setup_logging(self) -> None:
        self.wandb_run = None

    def _setup_distributed(self) -> None:
        return None

    def _setup_lora(self) -> None:
        if not self.config.use_lora:
            if self._preloaded_adapter:
                raise AdapterMismatchError(
                    "the model carries a PEFT adapter but use_lora=False; pass use_lora=True with the adapter's "
                    "settings, or load the plain base model for full-weight training"
                )
            return
        if not self._preloaded_adapter:
            super()._setup_lora()
            return
        from gliner2.training.lora import _PeftLoraLayer

        validate_adapter(self.model, self.config)
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad = is_adapter_parameter(name)
        self.lora_layers = {n: m for n, m in self.model.named_modules() if isinstance(m, _PeftLoraLayer)}
        self.model._lora_layers = self.lora_layers

    def _enable_checkpointing(self) -> None:
        encoder = getattr(unwrap(self.model), "encoder", None)
        enable = getattr(encoder, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ConfigError("gradient_checkpointing=True but this model's encoder does not support it")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.config.gradient_checkpointing = True

    # ---- preprocessing -------------------------------------------------------------------------------------

    def _collator(self, *, is_training: bool) -> ExtractorCollator:
        return ExtractorCollator(
            self.processor,
            is_training=is_training,
            max_len=self.max_len,
            architecture=getattr(unwrap(self.model), "architecture", "span"),
            max_gold_per_query=self.max_gold,
            build_targets=None if is_training else True,
            on_capacity_exceeded=self.config.on_capacity_exceeded,
            allow_invalid_samples=False,
            dedupe_contained_entity_spans=self.config.dedupe_contained_entity_spans,
        )

    # ---- operations ----------------------------------------------------------------------------------------

    def prepare(self, max_steps: int) -> None:
        """Optimizer, schedule and scaler exactly as native `train()` builds them for `max_steps` updates."""
        self._planned_max_steps = max_steps
        warmup = self.config.warmup_steps or int(max_steps * self.config.warmup_ratio)
        self.optimizer = self._create_optimizer()
        self.optimizer.register_step_pre_hook(self._refuse_non_finite_gradients)
        self.scheduler = get_scheduler(
            self.optimizer, self.config.scheduler_type, max_steps, warmup, self.config.num_cycles
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.global_step = 0
        self.epoch = 0
        self.model.train()
        self.processor.change_mode(is_training=True)
        self.apply_schedule_state()

    def backward(self, pairs: Sequence[Pair], micro_index: int) -> torch.Tensor:
        """One native micro-batch: collate (training mode), forward, loss / accumulation, backward."""
        with private_python_rng(self.python_rng):
            batch = self.train_collator(list(pairs))
        self._expected_rows = len(pairs)
        self._guard_active = True
        try:
            return self._backward_one(batch, micro_index, self.use_amp, self.amp_dtype, is_last_micro=True)
        finally:
            self._guard_active = False

    def _refuse_non_finite_gradients(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer pre-step hook: refuse the update when the gradient norm native clipping just computed is not
        finite (exactly when some gradient is NaN or infinite), so AdamW never writes them into the weights.

        Reusing that norm costs one scalar read instead of a second pass over every gradient. A trainer_factory
        whose `_optimizer_step` does not clip leaves no norm behind: then one fused norm is taken here."""
        norm = self._last_grad_norm
        if norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self._trainable if p.grad is not None])
        value = float(norm)
        if not math.isfinite(value):
            raise TrainingNumericsError(
                f"non-finite gradients (total gradient norm {value}); the update was not applied. Check the data and "
                "learning rate (DoRA on a fresh boundary head is a known cause), then resume from the last checkpoint"
            )

    def step(self, micro_batches: int) -> dict[str, float]:
        """One native optimizer update over `micro_batches` accumulated micro-batches (non-finite gradients are
        refused by the optimizer pre-step hook, see `_refuse_non_finite_gradients`)."""
        if not any(p.grad is not None for p in self._trainable):
            raise TrainingNumericsError("optim_step found no gradients; run forward_backward first")
        self._renormalize_partial_accumulation(micro_batches)
        self._last_grad_norm = None  # set by native clipping inside _optimizer_step, read by the pre-step hook
        self._optimizer_step()
        self.global_step += 1
        self._flush_delayed_counters()
        grad_norm = self._last_grad_norm
        return {
            "step": self.global_step,
            "learning_rate": float(self.scheduler.get_last_lr()[0]),
            "grad_norm": float(grad_norm) if grad_norm is not None else 0.0,
        }

    def evaluate_loss(self, pairs: Sequence[Pair]) -> dict[str, float]:
        """The native supervised loss of one batch in eval mode, without touching RNGs, modes or gradients."""
        saved = self.python_rng.getstate()
        with preserved_rng(self.device), self._eval_mode(), torch.no_grad():
            try:
                with private_python_rng(self.python_rng):
                    batch = self.eval_collator(list(pairs))
            finally:
                self.python_rng.setstate(saved)
            self._expected_rows = len(pairs)
            self._guard_active = True
            try:
                with torch.amp.autocast(device_type=self.device.type, enabled=self.use_amp, dtype=self.amp_dtype):
                    outputs = self.model(batch)
            finally:
                self._guard_active = False
        return {key: _scalar(outputs.get(key)) for key in LOSS_KEYS}

    def extract(
        self, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]], *, threshold: float, batch_size: int
    ) -> list[dict[str, Any]]:
        """gliner2's own batched inference (``batch_extract``) on the live model: eval mode, no grad, no RNG drawn
        (its DataLoader draws a torch seed; collation may draw Python randomness), training modes restored."""
        from gliner2.inference.schema import Schema

        built = [Schema.from_dict(dict(schema)) for schema in schemas]
        saved = self.python_rng.getstate()
        with preserved_rng(self.device), self._eval_mode(), torch.no_grad():
            try:
                with private_python_rng(self.python_rng):
                    with torch.amp.autocast(device_type=self.device.type, enabled=self.use_amp, dtype=self.amp_dtype):
                        return unwrap(self.model).batch_extract(
                            list(texts), built, batch_size=batch_size, threshold=threshold
                        )
            finally:
                self.python_rng.setstate(saved)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        was_training = self.model.training
        processor_training = getattr(self.processor, "is_training", True)
        self.model.eval()
        self.processor.change_mode(is_training=False)
        try:
            yield
        finally:
            self.model.train(was_training)
            self.processor.change_mode(is_training=processor_training)

    def last_losses(self) -> dict[str, float]:
        outputs = self._last_train_outputs or {}
        return {key: _scalar(outputs.get(key)) for key in LOSS_KEYS if key != "total_loss"}

    def apply_schedule_state(self) -> None:
        """Derive the boundary head's schedule scalars from the counters, as `_backward_one` does before a forward."""
        head = getattr(unwrap(self.model), "boundary_head", None)
        if head is None:
            return
        planned = max(getattr(self, "_planned_max_steps", 1), 1)
        head.set_gold_injection_prob(
            self._gold_injection_probability(
                self.global_step / planned,
                self.config.gold_injection_start,
                self.config.gold_injection_end,
                self.config.gold_injection_hold_frac,
            )
        )
        settings = getattr(head, "settings", None)
        warmup = getattr(settings, "consistency_warmup_steps", 0)
        head.set_consistency_scale(1.0 if warmup <= 0 else min(self.global_step / warmup, 1.0))
        head.set_soft_iou_scale(
            self._soft_iou_anneal_scale(self.global_step, getattr(settings, "soft_iou_anneal_steps", 0))
        )

    def schedule_state(self) -> dict[str, float]:
        head = getattr(unwrap(self.model), "boundary_head", None)
        if head is None:
            return {}
        return {
            key: float(getattr(head, attr))
            for key, attr in (
                ("gold_injection_prob", "_gold_injection_prob"),
                ("consistency_scale", "_consistency_scale"),
                ("soft_iou_scale", "_soft_iou_scale"),
            )
            if hasattr(head, attr)
        }

    def load_schedule_state(self, values: dict[str, float]) -> None:
        """Put back the exact scalars the last micro-batch used (they lag the step counter by one update)."""
        head = getattr(unwrap(self.model), "boundary_head", None)
        if head is None or not values:
            return
        head.set_gold_injection_prob(values["gold_injection_prob"])
        head.set_consistency_scale(values["consistency_scale"])
        head.set_soft_iou_scale(values["soft_iou_scale"])

    def counters(self) -> dict[str, Any]:
        return {
            "global_step": int(self.global_step),
            "epoch": int(self.epoch),
            "planned_max_steps": int(self._planned_max_steps),
            "skip_counter": int(self._skip_counter.item()) if self._skip_counter is not None else None,
            "loss_accum": float(self._loss_accum.item()) if self._loss_accum is not None else None,
        }

    def load_counters(self, counters: dict[str, Any]) -> None:
        self.global_step = int(counters["global_step"])
        self.epoch = int(counters["epoch"])
        self._planned_max_steps = int(counters["planned_max_steps"])
        if counters.get("skip_counter") is None:
            self._skip_counter = None
            self._loss_accum = None
        else:
            self._skip_counter = torch.tensor(int(counters["skip_counter"]), dtype=torch.long, device=self.device)
            self._loss_accum = torch.tensor(float(counters["loss_accum"]), dtype=torch.float32, device=self.device)
        self.apply_schedule_state()

    def detached_model_copy(self, state: Mapping[str, torch.Tensor] | None = None) -> Any:
        """A deep CPU copy of the live model without hooks or gradients, optionally with `state` loaded into it."""
        self._guard_handle.remove()
        for handle in self._finite_grad_hook_handles:
            handle.remove()
        try:
            duplicate = copy.deepcopy(self.model)
        finally:
            self._guard_handle = unwrap(self.model).register_forward_hook(self._guard_outputs)
            self._install_finite_grad_hooks()
        for parameter in duplicate.parameters():
            parameter.grad = None
        duplicate.to("cpu")
        duplicate.eval()
        if state is not None:
            names = set(duplicate.state_dict())
            unknown = sorted(set(state) - names)
            if unknown:
                raise ValueError(f"detached weights name parameters the model lacks: {unknown[:5]}")
            with torch.no_grad():
                live = duplicate.state_dict()
                for name, tensor in state.items():
                    live[name].copy_(tensor)
        return duplicate

    def close(self) -> None:
        self._guard_handle.remove()
        for handle in self._finite_grad_hook_handles:
            handle.remove()
        self._finite_grad_hook_handles = []

    # ---- guards ----------------------------------------------------------------------------------------------

    def _guard_outputs(self, module: torch.nn.Module, args: Any, outputs: Any) -> None:
        if not self._guard_active:
            return
        loss = outputs.get("total_loss") if hasattr(outputs, "get") else None
        rows = self._expected_rows
        valid = outputs.get("batch_size") if hasattr(outputs, "get") else None
        if isinstance(valid, int) and valid != rows:
            raise RecordError(
                f"the model could not process {rows - valid} of {rows} sample(s) in this batch (gliner2 printed "
                "the per-sample error above); nothing was applied. Fix or remove those records and re-plan"
            )
        if loss is None:
            raise RecordError(
                "this batch produced no loss (no supervised target in any sample); nothing was applied. "
                "Every training record needs at least one task with targets"
            )
        if torch.is_grad_enabled() and self._trainable and not loss.requires_grad:
            raise TrainingNumericsError(
                "the loss does not require grad although parameters are trainable (reentrant activation "
                "checkpointing with frozen embeddings does this); refusing to substitute a zero loss"
            )
        if not bool(torch.isfinite(loss.detach()).all()):
            raise TrainingNumericsError(
                f"non-finite loss ({float(loss.detach()):.4g}) in this batch; nothing was applied. Check the data "
                "and learning rate, then resume from the last checkpoint"
            )


LOSS_KEYS = ("total_loss", "classification_loss", "structure_loss", "count_loss")


def _scalar(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu())
    return float(value)


def is_adapter_parameter(name: str) -> bool:
    """True for parameters of the single default PEFT adapter (LoRA A/B, DoRA magnitude)."""
    return ".default" in name and any(part in name for part in ("lora_A", "lora_B", "lora_magnitude_vector"))


def validate_adapter(model: torch.nn.Module, config: NativeTrainingConfig) -> None:
    """A preloaded adapter must be the single default LoRA adapter with exactly the configured settings."""
    peft_config = getattr(model, "peft_config", {})
    names = sorted(peft_config)
    if names != ["default"]:
        raise AdapterMismatchError(
            f"expected exactly one adapter named 'default', found {names}; merge or drop the others"
        )
    adapter = peft_config["default"]
    if getattr(adapter, "inference_mode", False):
        raise AdapterMismatchError(
            "the preloaded adapter is in inference mode (frozen); load it with "
            "PeftModel.from_pretrained(base, path, is_trainable=True)"
        )
    settings = {
        k: getattr(adapter, k, None) for k in ("r", "lora_alpha", "lora_dropout", "use_dora", "bias", "target_modules")
    }
    _raise_adapter_diffs(model, config, settings, "the preloaded adapter")


def validate_adapter_config(
    model: torch.nn.Module, config: NativeTrainingConfig, settings: dict[str, Any], source: str
) -> None:
    """An adapter directory's adapter_config.json must declare exactly the session's LoRA settings."""
    if str(settings.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterMismatchError(
            f"{source} is a {settings.get('peft_type')} adapter; only LoRA adapters are supported"
        )
    _raise_adapter_diffs(model, config, settings, f"the adapter in {source}")


def _raise_adapter_diffs(
    model: torch.nn.Module, config: NativeTrainingConfig, settings: dict[str, Any], what: str
) -> None:
    targets = settings.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    checks = [
        ("lora_r", settings.get("r"), config.lora_r),
        ("lora_alpha", _num(settings.get("lora_alpha")), float(config.lora_alpha)),
        ("lora_dropout", _num(settings.get("lora_dropout")), float(config.lora_dropout)),
        ("lora_use_dora", bool(settings.get("use_dora")), bool(config.lora_use_dora)),
        ("bias", settings.get("bias", "none"), "none"),
        ("resolved targets", targets, expected_targets(model, config)),
    ]
    diffs = [f"{name}: adapter has {have!r}, config asks {want!r}" for name, have, want in checks if have != want]
    if diffs:
        raise AdapterMismatchError(
            f"{what} does not match the configuration: "
            + "; ".join(diffs)
            + ". Set the TrainingConfig LoRA fields to the adapter's values, "
            "or start fresh adapters from the base model"
        )


def expected_targets(model: torch.nn.Module, config: NativeTrainingConfig) -> list[str]:
    """gliner2's resolved LoRA target paths for the configured groups, on a plain or PEFT-injected model."""
    from gliner2.training.lora import _resolve_targets

    return sorted(_resolve_targets(_PlainView(unwrap(model)), list(config.lora_target_modules)))


class _PlainView:
    """A PEFT-injected model's modules as the plain model had them, for gliner2's own target resolution."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def named_modules(self) -> Iterator[tuple[str, torch.nn.Module]]:
        from peft.tuners.lora.layer import LoraLayer

        for name, module in self._model.named_modules():
            if ".lora_" in name or name.endswith(".base_layer") or ".base_layer." in name:
                continue
            yield name, (module.get_base_layer() if isinstance(module, LoraLayer) else module)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


@contextlib.contextmanager
def private_python_rng(rng: random.Random) -> Iterator[None]:
    """Route gliner2's preprocessing (`gliner2.processor.random`) to a session's own Python random stream."""
    import gliner2.processor as processor_module

    previous = processor_module.random
    processor_module.random = rng  # type: ignore[assignment]
    try:
        yield
    finally:
        processor_module.random = previous


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Run a block without consuming any Python, NumPy, Torch or CUDA random state."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
