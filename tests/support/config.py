"""The one training-config factory for tests, the chaos engine and test-sized runs: tiny values, overrides win."""

from __future__ import annotations

from typing import Any

__all__ = ["training_config"]


def training_config(**overrides: Any) -> dict[str, Any]:
    """The tiny test training config as a plain dict (flow parameter, ``TrainingConfig(**...)`` input).

    2 records per batch, 2 micro-batches per update, 2 epochs, validation at every epoch end; ``use_lora=True``
    brings ``lora_dropout=0.1`` unless given. A plain dict, so that bad-input tests can override with invalid values.
    """
    values: dict[str, Any] = dict(
        fp16=False,
        bf16=False,
        batch_size=2,
        gradient_accumulation_steps=2,
        num_epochs=2,
        eval_strategy="epoch",
        seed=11,
        encoder_lr=1e-3,
        task_lr=2e-3,
        warmup_ratio=0.2,
        lora_r=4,
        lora_alpha=8.0,
    )
    values.update(overrides)
    if values.get("use_lora"):
        values.setdefault("lora_dropout", 0.1)
    return values
