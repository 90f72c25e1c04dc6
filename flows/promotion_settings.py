"""The retraining flow's ``promotion`` parameter: the promotion rule's settings as a section of the run form.

Each field is a :class:`~prefect_gliner2.session_core.promotion_rule.PromotionRule` setting with the same default and
range (checked by the server before a run is created); ``to_rule`` is the one conversion. How the settings combine
into the rule is told in :mod:`prefect_gliner2.session_core.promotion`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prefect_gliner2.session_core.promotion_rule import PromotionRule

__all__ = ["DEFAULT_PROMOTION", "PromotionSettings"]

_RULE = PromotionRule()


class PromotionSettings(BaseModel):
    """When a candidate replaces the current model: better beyond noise, no well-supported label lost, no forgetting
    on the guard set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    margin: float = Field(
        default=_RULE.margin,
        gt=-1.0,
        lt=1.0,
        description="Promote only when the lower bound of the interval of (candidate F1 - current F1) on the test "
        "records is above this (F1 units). 0: better beyond sampling noise; negative: not worse by more than that.",
    )
    confidence: float = Field(
        default=_RULE.confidence, gt=0.0, lt=1.0, description="Confidence level of every interval, e.g. 0.95."
    )
    resamples: int = Field(
        default=_RULE.resamples,
        ge=100,
        le=1_000_000,
        description="Paired bootstrap resamples of whole records (2,000 take about a second on 5,000 records).",
    )
    seed: int = Field(
        default=_RULE.seed, ge=0, description="The bootstrap's seed: the same scores give the same decision."
    )
    method: Literal["percentile", "basic", "BCa"] = Field(
        default="percentile", description="The interval method (scipy.stats.bootstrap)."
    )
    min_support: int = Field(
        default=_RULE.min_support,
        ge=1,
        description="A label with fewer gold items on a set is shown, not judged for a drop.",
    )
    max_label_drop: float = Field(
        default=_RULE.max_label_drop,
        ge=0.0,
        le=1.0,
        description="How much F1 a well-supported label may lose before a drop whose whole interval lies below 0 "
        "rejects the candidate.",
    )
    min_vanish_support: int = Field(
        default=_RULE.min_vanish_support,
        ge=1,
        description="A label with at least this many gold items that the current model finds may not fall to F1 0.",
    )
    max_guard_drop: float = Field(
        default=_RULE.max_guard_drop,
        ge=0.0,
        le=1.0,
        description="How much micro F1 the guard set may lose, judged like a label's drop.",
    )

    def to_rule(self) -> PromotionRule:
        return PromotionRule.from_dict(self.model_dump())


DEFAULT_PROMOTION = PromotionSettings()
assert DEFAULT_PROMOTION.to_rule() == _RULE, "the form's defaults are the rule's"
