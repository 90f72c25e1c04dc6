"""session_core: exact, resumable GLiNER2 training sessions over gliner2's native trainer.

Planning (TrainingConfig, records, ManagedTrainingPlan, manifests) is torch-free and imported eagerly; the
session, managed driver and weights helpers import torch and gliner2, and load on first attribute access.
``InputExample`` is gliner2's own record class (``gliner2.training.InputExample``), re-exported lazily: using it
imports gliner2 and so torch; torch-free planning takes native dicts ``{"input": text, "output": {...}}`` or JSONL.

Exceptions (all in prefect_gliner2.session_core.errors): SessionCoreError and its subclasses ConfigError, RecordError,
ManifestError, PlanMismatchError, PrecisionError, CheckpointError (and its CheckpointDamagedError), StateMismatchError,
WeightsError, AdapterMismatchError, SessionStateError, TrainingNumericsError.
"""

from __future__ import annotations

if __name__ != "prefect_gliner2.session_core":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.session_core, not {__name__}: a second copy would split every class")

import importlib
from typing import Any

from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import (
    AdapterMismatchError,
    CheckpointDamagedError,
    CheckpointError,
    ConfigError,
    ManifestError,
    PlanMismatchError,
    PrecisionError,
    RecordError,
    SessionCoreError,
    SessionStateError,
    StateMismatchError,
    TrainingNumericsError,
    WeightsError,
)
from prefect_gliner2.session_core.plan import ManagedTrainingPlan, PlanBatch

_LAZY = {
    "InputExample": ("gliner2.training", "InputExample"),
    "TrainingSession": ("prefect_gliner2.session_core.session", "TrainingSession"),
    "ManagedTraining": ("prefect_gliner2.session_core.managed", "ManagedTraining"),
    "load_exported_model": ("prefect_gliner2.session_core.weights", "load_exported_model"),
}

__all__ = [
    "AdapterMismatchError",
    "CheckpointDamagedError",
    "CheckpointError",
    "ConfigError",
    "InputExample",
    "ManagedTraining",
    "ManagedTrainingPlan",
    "ManifestError",
    "PlanBatch",
    "PlanMismatchError",
    "PrecisionError",
    "RecordError",
    "SessionCoreError",
    "SessionStateError",
    "StateMismatchError",
    "TrainingConfig",
    "TrainingNumericsError",
    "TrainingSession",
    "WeightsError",
    "load_exported_model",
]


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'prefect_gliner2.session_core' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value
