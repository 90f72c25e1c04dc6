"""The engine's hidden state: counters and the boundary head's schedule scalars, which are not in ``state_dict``.

A checkpoint must carry ``global_step``, ``epoch``, ``_planned_max_steps`` (its native fallback of 1 makes the
gold-injection schedule jump to its end), ``_skip_counter`` / ``_loss_accum``, and the boundary head's gold
injection, consistency and soft-IoU scales (they change every later loss): ``EngineState`` reads and restores them.
Touches gliner2 internals: those trainer attributes, ``_gold_injection_probability``, ``_soft_iou_anneal_scale`` and
the boundary head's ``_gold_injection_prob`` / ``_consistency_scale`` / ``_soft_iou_scale``.
"""

from __future__ import annotations

from typing import Any

import torch
from gliner2.training.trainer import ExtractorTrainer

from prefect_gliner2.training.engine.lora import unwrap

__all__ = ["EngineState"]


class EngineState(ExtractorTrainer):
    """Counters and schedule scalars of gliner2's trainer, read and restored (part of ``SessionEngine``)."""

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
