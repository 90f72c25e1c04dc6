"""prefect-gliner2: exact, resumable, observable GLiNER2 fine-tuning as Prefect flows.

The public API, one import away (each name loads its module on first use, so ``import prefect_gliner2`` and
``import prefect_gliner2.session_core`` stay free of torch and Prefect):

    from prefect_gliner2 import train_flow, retrain_flow, TrainingConfig, ManagedTrainingPlan

Packages (arrows point down only):

    prefect_gliner2.deployments    prefect.yaml and serve.py
    prefect_gliner2.flows          train and retrain flows, the unit driver, run reporting, the CLI
    prefect_gliner2.tasks          Prefect tasks only (batches, checkpoints, validation, export, held-out eval)
    prefect_gliner2.model_registry versioned model directories and the CURRENT pointer
    prefect_gliner2.runtime        Prefect-free machinery: session worker, run directory, lease, schedule
    prefect_gliner2.session_core   no Prefect: planning (torch-free) and the session over gliner2's trainer

Errors: one tree, drawn in ``prefect_gliner2.session_core.errors`` (PrefectGliner2Error; SessionCoreError for the
deterministic ones, never retried; TransientError for those a retry may cure); the common ones are exported here.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # planning and the training session (session_core)
    "TrainingConfig": "prefect_gliner2.session_core",
    "ManagedTrainingPlan": "prefect_gliner2.session_core",
    "PlanBatch": "prefect_gliner2.session_core",
    "InputExample": "prefect_gliner2.training",
    "TrainingSession": "prefect_gliner2.training",
    "ManagedTraining": "prefect_gliner2.training",
    "load_exported_model": "prefect_gliner2.training",
    # errors (one tree, drawn in prefect_gliner2.session_core.errors; each class in the layer that raises it)
    "PrefectGliner2Error": "prefect_gliner2.session_core.errors",
    "SessionCoreError": "prefect_gliner2.session_core.errors",
    "TransientError": "prefect_gliner2.session_core.errors",
    "ConfigError": "prefect_gliner2.session_core.errors",
    "RecordError": "prefect_gliner2.session_core.errors",
    "CheckpointError": "prefect_gliner2.session_core.errors",
    "PlanMismatchError": "prefect_gliner2.session_core.errors",
    "RegistryError": "prefect_gliner2.model_registry.store",
    "RunConflictError": "prefect_gliner2.runtime.errors",
    "RunKeyError": "prefect_gliner2.runtime.errors",
    "RunLockedError": "prefect_gliner2.runtime.errors",
    "StorageFullError": "prefect_gliner2.runtime.errors",
    "SweepIncompleteError": "prefect_gliner2.flows.sweep",
    "WorkerDied": "prefect_gliner2.runtime.errors",
    "WorkerError": "prefect_gliner2.runtime.errors",
    # flows
    "train_flow": "prefect_gliner2.flows.train",
    "retrain_flow": "prefect_gliner2.flows.retrain",
    "TrainingConfigModel": "prefect_gliner2.flows.train",
    "TrainingSettings": "prefect_gliner2.flows.params",
    # the model registry
    "ModelRegistry": "prefect_gliner2.model_registry",
    "ModelVersion": "prefect_gliner2.model_registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'prefect_gliner2' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
