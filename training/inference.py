"""gliner2's public batched extraction on a loaded model, as the extractor the scoring functions call."""

from __future__ import annotations

from typing import Any

from prefect_gliner2.session_core.evaluation import Extract
from prefect_gliner2.session_core.thresholds import Thresholds, fixed

__all__ = ["model_extractor"]


def model_extractor(model: Any, *, threshold: float | Thresholds = 0.5, batch_size: int = 8) -> Extract:
    """gliner2's public batched extraction (``batch_extract``) on a loaded model, for scoring an exported model, at
    one `threshold` or a model's :class:`Thresholds`."""
    chosen = threshold if isinstance(threshold, Thresholds) else fixed(threshold)

    def extract(texts: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import torch
        from gliner2 import Schema

        built = [Schema.from_dict(chosen.apply(schema)) for schema in schemas]
        with torch.no_grad():
            results: list[dict[str, Any]] = model.batch_extract(
                texts, built, batch_size=batch_size, threshold=chosen.threshold
            )
        return results

    return extract
