"""The MLflow model code of an export (MLflow's "models from code"): ``GlinerExtraction``, whose ``predict`` extracts
from texts with the product's own extraction (``runtime.extract_model.Extractor``: gliner2's batched extraction,
long texts in word windows), the thresholds fitted for the model and the schema it was trained on, both read from
the export's ``export.json``.

MLflow copies this file into each logged model (``runtime.mlflow_model``) and runs it when the model is loaded: it
ends with ``set_model``, so importing it also sets MLflow's model-from-code. A user loads the model as any MLflow
model::

    model = mlflow.pyfunc.load_model("models:/ner@champion")
    model.predict(["Ada Lovelace was born in London."])  # [{"entities": {"person": ["Ada Lovelace"], ...}}]

Loading needs this package with its ``mlflow`` extra (gliner2, torch, the MLflow client and pandas). Prefect-free.
"""

from __future__ import annotations

from typing import Any

import mlflow.models
from mlflow.pyfunc.model import PythonModel

from prefect_gliner2.runtime.extract_model import Extractor, resolve_model
from prefect_gliner2.runtime.mlflow_model import ARTIFACT
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, fixed, read_thresholds

__all__ = ["GlinerExtraction"]

CHUNK_SIZE, CHUNK_OVERLAP, BATCH_SIZE = 384, 64, 8  # prefect-gliner2 extract's defaults (ExtractSettings)


class GlinerExtraction(PythonModel):  # type: ignore[misc]
    """An export as a pyfunc model: texts in, one gliner2 result per text out (``{"entities": {label: [text]}}``,
    relations and structures as the trained schema has them), at the export's fitted thresholds."""

    def load_context(self, context: Any) -> None:
        """Read the export's thresholds and schema; the model itself is loaded by the first ``predict``."""
        self._ref = resolve_model(context.artifacts[ARTIFACT])
        self._schema = self._ref.trained_schema() or {}
        self._extractor: Extractor | None = None

    def predict(
        self, context: Any, model_input: list[str], params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """One gliner2 result per text, with the schema the model was trained on and its fitted thresholds."""
        if not self._schema:
            raise ValueError(f"{self._ref.uri} records no trained schema in its export.json: nothing to extract")
        if self._extractor is None:
            thresholds = read_thresholds(self._ref.uri) or fixed(DEFAULT_THRESHOLD)
            self._extractor = Extractor(
                self._ref,
                threshold=thresholds.threshold,
                per_label=thresholds,
                batch_size=BATCH_SIZE,
                chunk_size=CHUNK_SIZE,
                chunk_overlap=CHUNK_OVERLAP,
            )
        texts = [str(text) for text in model_input]
        results, _ = self._extractor.extract(texts, [self._schema] * len(texts))
        return [dict(result) for result in results]


mlflow.models.set_model(GlinerExtraction())
