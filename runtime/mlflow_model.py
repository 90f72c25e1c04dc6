"""How an export is logged as an MLflow model: the keyword arguments of ``mlflow.models.Model.log`` for the pyfunc
flavour (the model code ``runtime/mlflow_pyfunc.py``, the export directory as its artifact, the requirements pinned
to the installed versions, an input example), handed to the training run's MLflow mirror
(``model_registry.mlflow_sync``). Imports no mlflow (the mirror's thread does); Prefect-free."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

__all__ = ["ARTIFACT", "INPUT_EXAMPLE", "pip_requirements", "pyfunc_model"]

MODEL_CODE = Path(__file__).with_name("mlflow_pyfunc.py")
ARTIFACT = "export"  # the export directory's name among the model's artifacts (mlflow_pyfunc.py reads it)
INPUT_EXAMPLE = ["Ada Lovelace was born in London.", "Alan Turing worked at the University of Manchester."]
# what loading the model imports: this package, gliner2 and its stack, the MLflow client and pandas (mlflow.pyfunc)
_PINNED = ("prefect-gliner2", "gliner2", "torch", "transformers", "peft", "safetensors", "mlflow-skinny", "pandas")


def pip_requirements() -> list[str]:
    """What loading the model needs, pinned to the installed versions (those that trained and logged it)."""
    pins = []
    for name in _PINNED:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def pyfunc_model(export_dir: str) -> dict[str, Any]:
    """``Model.log``'s pyfunc arguments for the export in local directory `export_dir`."""
    return {
        "python_model": str(MODEL_CODE),
        "artifacts": {ARTIFACT: export_dir},
        "pip_requirements": pip_requirements(),
        "input_example": list(INPUT_EXAMPLE),
    }
