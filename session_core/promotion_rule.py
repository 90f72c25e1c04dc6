"""The settings of the promotion rule: margin, confidence, bootstrap resamples and seed, per-label and guard tolerances.

Frozen and validated: a wrong value fails when the rule is built, with the field, what it got and what it takes.
How the settings combine into the rule is told in :mod:`.promotion`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from prefect_gliner2.session_core.bootstrap import METHODS
from prefect_gliner2.session_core.errors import ConfigError

__all__ = ["PromotionRule"]

_MAX_RESAMPLES = 1_000_000


@dataclass(frozen=True)
class PromotionRule:
    """How sure, and by how much, a candidate must beat the current model; how much a label or the guard set may lose.

    margin: the lower bound of the interval of (candidate F1 - current F1) must be above this (F1 units, -1 < m < 1;
        0 asks for a candidate better beyond noise, a negative margin for one not worse by more than -margin).
    confidence: the two-sided confidence level of every interval (0 < c < 1).
    resamples: paired bootstrap resamples (100 .. 1,000,000); 2,000 take under a second on 5,000 records.
    seed: the bootstrap's seed (>= 0): the same counts, rule and seed give the same decision.
    method: scipy.stats.bootstrap's interval method, one of "percentile", "basic", "BCa".
    min_support: labels with fewer gold items on a set are shown, not judged for a drop (>= 1).
    max_label_drop: how much F1 a label may lose (point estimate) before a drop whose interval lies below 0 rejects.
    min_vanish_support: a label with at least this many gold items that the current model finds may not fall to F1 0.
    max_guard_drop: how much micro F1 the guard set may lose, judged like a label's drop.
    """

    margin: float = 0.0
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    method: str = "percentile"
    min_support: int = 10
    max_label_drop: float = 0.05
    min_vanish_support: int = 1
    max_guard_drop: float = 0.05

    def __post_init__(self) -> None:
        self._number("margin", -1.0, 1.0, "strictly between -1 and 1 (F1 units)", open_low=True, open_high=True)
        self._number("confidence", 0.0, 1.0, "strictly between 0 and 1, e.g. 0.95", open_low=True, open_high=True)
        self._integer("resamples", 100, _MAX_RESAMPLES)
        self._integer("seed", 0, None)
        self._integer("min_support", 1, None)
        self._integer("min_vanish_support", 1, None)
        self._number("max_label_drop", 0.0, 1.0, "between 0 and 1 (F1 units)")
        self._number("max_guard_drop", 0.0, 1.0, "between 0 and 1 (F1 units)")
        if self.method not in METHODS:
            raise ConfigError(f"PromotionRule.method must be one of {list(METHODS)}, got {self.method!r}")

    def _number(
        self, name: str, low: float, high: float, what: str, *, open_low: bool = False, open_high: bool = False
    ) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"PromotionRule.{name} must be a number {what}, got {value!r}")
        below = value <= low if open_low else value < low
        above = value >= high if open_high else value > high
        if below or above:
            raise ConfigError(f"PromotionRule.{name} must be {what}, got {value!r}")
        object.__setattr__(self, name, float(value))

    def _integer(self, name: str, low: int, high: int | None) -> None:
        value = getattr(self, name)
        limits = f">= {low}" if high is None else f"between {low} and {high:,}"
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise ConfigError(f"PromotionRule.{name} must be an integer {limits}, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromotionRule:
        """From :meth:`to_dict` or a partial dict of settings (missing ones take their defaults)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a promotion rule must be a mapping of settings, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown promotion rule settings {unknown}; the settings are {sorted(known)}")
        return cls(**dict(data))
