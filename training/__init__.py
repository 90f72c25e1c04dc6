"""The torch training layer: the session over gliner2's native trainer, the managed driver, weights in and out.

This package is the one-import public API of the specification (``from gliner2.training import ...`` there)::

    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession

Planning names (``TrainingConfig``, ``ManagedTrainingPlan``, ``PlanBatch``, the errors) come from the torch-free
layer ``prefect_gliner2.session_core`` and are imported eagerly; the training names (``TrainingSession``,
``ManagedTraining``, ``load_exported_model``, gliner2's own ``InputExample``) import torch and gliner2 and load on
first use, so ``from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig`` plans without torch.

Modules:

    session.py             TrainingSession: forward, forward_backward, optim_step, save/load state, weights
    session_checkpoint.py  what a session checkpoint holds and how it is restored
    managed.py             ManagedTraining: the plan driven with validation, best selection, early stopping
    managed_export.py      what a managed run exports (best or final weights, thresholds, schema)
    weights.py             load_weights / export_weights / load_exported_model
    state.py               tensors in and out of checkpoint files (RNG states, optimizer, pending gradients)
    native_save.py         a native model directory written with its digests, in one pass
    extractor_loading.py   loading a native model directory as gliner2 does
    inference.py           gliner2's public batched extraction as the scoring functions' extractor
    prefetch.py            a checkpoint's tensors read ahead, before gliner2 is imported
    engine/                the adapter over gliner2's ExtractorTrainer: the only code touching gliner2 internals
    tiny/                  tiny offline models and data for tests, benchmarks and the demo

Arrows point down only: ``training`` imports ``session_core``, never the reverse (``tests/test_layers.py``).
"""

from __future__ import annotations

if __name__ != "prefect_gliner2.training":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.training, not {__name__}: a second copy would split every class")

import importlib
from typing import Any

from prefect_gliner2.session_core import (
    AdapterMismatchError,
    CheckpointDamagedError,
    CheckpointError,
    ConfigError,
    ManagedTrainingPlan,
    ManifestError,
    PlanBatch,
    PlanMismatchError,
    PrecisionError,
    PrefectGliner2Error,
    RecordError,
    SessionCoreError,
    SessionStateError,
    StateMismatchError,
    TrainingConfig,
    TrainingNumericsError,
    TransientError,
    WeightsError,
)

_LAZY = {
    "InputExample": ("gliner2.training", "InputExample"),
    "TrainingSession": ("prefect_gliner2.training.session", "TrainingSession"),
    "ManagedTraining": ("prefect_gliner2.training.managed", "ManagedTraining"),
    "load_exported_model": ("prefect_gliner2.training.weights", "load_exported_model"),
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
        raise AttributeError(f"module 'prefect_gliner2.training' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
