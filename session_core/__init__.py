"""session_core: exact, resumable GLiNER2 training sessions over gliner2's native trainer.

Planning (TrainingConfig, records, ManagedTrainingPlan, manifests) is torch-free and imported eagerly; the
session, managed driver and weights helpers import torch and gliner2, and load on first attribute access.
``InputExample`` is gliner2's own record class (``gliner2.training.InputExample``), re-exported lazily: using it
imports gliner2 and so torch; torch-free planning takes native dicts ``{"input": text, "output": {...}}`` or JSONL.

Modules: planning (``config`` + ``config_checks``, ``records`` + ``record_checks`` + ``canonical``, ``plan`` +
``plan_order`` + ``plan_types``, ``manifest``, ``storage`` + ``commits`` + ``tempcopies``, ``layout``,
``checkpoint/``), annotation formats in and out (``formats/``: CoNLL/BIO, spaCy, Label Studio, doccano), the
session (``session`` + ``session_checkpoint``, ``managed`` + ``managed_export``, ``weights``, ``state``), the engine
adapter over gliner2 (``engine/``, the only code that touches gliner2 internals), scoring, and the offline tiny
models (``tiny/``).

Exceptions: every exception the product raises is in ``prefect_gliner2.session_core.errors``, whose docstring draws
the tree: PrefectGliner2Error, with the deterministic SessionCoreError branch (ConfigError, RecordError, ManifestError,
PlanMismatchError, PrecisionError, CheckpointError and its CheckpointDamagedError, StateMismatchError, WeightsError
and its AdapterMismatchError, SessionStateError, TrainingNumericsError, and the run-level errors) and the
TransientError branch (a retry may help). The session's own are re-exported here.
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
    PrefectGliner2Error,
    RecordError,
    SessionCoreError,
    SessionStateError,
    StateMismatchError,
    TrainingNumericsError,
    TransientError,
    WeightsError,
)
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
from prefect_gliner2.session_core.plan_types import PlanBatch

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
    "PrefectGliner2Error",
    "RecordError",
    "SessionCoreError",
    "SessionStateError",
    "StateMismatchError",
    "TrainingConfig",
    "TrainingNumericsError",
    "TrainingSession",
    "TransientError",
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
