"""The plan's serializable values: a micro-batch (PlanBatch) and how validation selects and stops (SelectionPolicy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ManifestError

__all__ = ["PlanBatch", "SelectionPolicy"]


@dataclass(frozen=True)
class PlanBatch:
    """One micro-batch of the plan: JSON-serializable, passed to ``TrainingSession.forward_backward``."""

    index: int
    epoch: int
    rows: tuple[int, ...]
    examples: tuple[dict[str, Any], ...]
    is_update: bool
    is_epoch_end: bool
    is_validation: bool
    window_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "epoch": self.epoch,
            "rows": list(self.rows),
            "examples": list(self.examples),
            "is_update": self.is_update,
            "is_epoch_end": self.is_epoch_end,
            "is_validation": self.is_validation,
            "window_size": self.window_size,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanBatch:
        """Rebuild from ``to_dict()`` output; malformed input raises ``ManifestError``."""
        names = ("index", "epoch", "rows", "examples", "is_update", "is_epoch_end", "is_validation", "window_size")
        if not isinstance(data, Mapping) or set(data) != set(names):
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ManifestError(
                f"a PlanBatch dict needs exactly the keys {list(names)}, got {got}; use PlanBatch.to_dict()"
            )
        ints = [data[k] for k in ("index", "epoch", "window_size")] + list(data["rows"])
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            raise ManifestError("PlanBatch index, epoch, window_size and rows must be non-negative integers")
        flags = [data[k] for k in ("is_update", "is_epoch_end", "is_validation")]
        if not all(isinstance(v, bool) for v in flags) or not all(isinstance(e, Mapping) for e in data["examples"]):
            raise ManifestError("PlanBatch flags must be booleans and examples must be record objects")
        if len(data["rows"]) != len(data["examples"]):
            raise ManifestError(f"PlanBatch has {len(data['rows'])} rows but {len(data['examples'])} examples")
        return cls(
            index=data["index"],
            epoch=data["epoch"],
            rows=tuple(data["rows"]),
            examples=tuple(dict(e) for e in data["examples"]),
            is_update=data["is_update"],
            is_epoch_end=data["is_epoch_end"],
            is_validation=data["is_validation"],
            window_size=data["window_size"],
        )


@dataclass(frozen=True)
class SelectionPolicy:
    """How validation results choose the best checkpoint and stop early (the native trainer's semantics)."""

    metric_for_best: str
    greater_is_better: bool
    save_best: bool
    early_stopping: bool
    early_stopping_patience: int
    early_stopping_threshold: float
    eval_strategy: str
    eval_steps: int

    @classmethod
    def from_config(cls, config: TrainingConfig) -> SelectionPolicy:
        return cls(
            metric_for_best=str(config.metric_for_best),
            greater_is_better=bool(config.greater_is_better),
            save_best=config.save_best,
            early_stopping=config.early_stopping,
            early_stopping_patience=config.early_stopping_patience,
            early_stopping_threshold=config.early_stopping_threshold,
            eval_strategy=config.eval_strategy,
            eval_steps=config.eval_steps,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
