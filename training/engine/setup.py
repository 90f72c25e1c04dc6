"""Constructing the engine: gliner2's trainer set-up hooks replaced for an explicit device, no files, and LoRA.

``EngineSetup.__init__`` runs the native constructor with these overrides: ``_setup_seed`` (plus a private
Python stream), ``_setup_device`` (the given device, fp32 unless bf16), ``_setup_output_dir`` / ``_setup_logging``
(nothing written, no logging reconfigured), ``_setup_distributed`` (none), and ``_setup_lora`` (a preloaded PEFT
adapter is validated and continued instead of re-initialised; it reads gliner2's ``_PeftLoraLayer``). It also
enables non-reentrant activation checkpointing and builds the native ``ExtractorCollator`` for training and eval.
Touches gliner2 internals: the ``_setup_*`` hooks, ``_get_model_config``, ``model._lora_layers``.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gliner2.training.trainer import ExtractorCollator, ExtractorTrainer
from gliner2.training.trainer import TrainingConfig as NativeTrainingConfig

from prefect_gliner2.session_core.errors import AdapterMismatchError, ConfigError
from prefect_gliner2.training.engine.lora import is_adapter_parameter, is_peft, unwrap, validate_adapter

__all__ = ["EngineSetup", "configure_sampling"]


def configure_sampling(processor: Any, *, shuffle_entities: bool, synthetic_entity_label_prob: float) -> None:
    """Set the training-time sampling of gliner2's processor (``SamplingConfig``) for a session: a new config object
    replacing the processor's), with entity label shuffling and synthetic labels as the session's
    configuration asks. The processor draws from the session's private stream (see ``rng.py``), so the sampling is
    as exact on resume as the rest of preprocessing."""
    from gliner2.processor import SamplingConfig

    current = getattr(processor, "sampling_config", None) or SamplingConfig()
    processor.sampling_config = dataclasses.replace(
        current, shuffle_entities=bool(shuffle_entities), synthetic_entity_label_prob=float(synthetic_entity_label_prob)
    )


class EngineSetup(ExtractorTrainer):
    """gliner2's trainer constructed for a session (the engine's construction; see the module docstring)."""

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
        self._queue_loss = False  # set while a training micro-batch runs: its loss is queued, not read (guards.py)
        self._queued_losses: list[torch.Tensor] = []
        self._read_losses: list[float] = []
        self._step_readings: dict[str, float] | None = None
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
