"""session_core: the torch-free planning layer under the training session.

Everything here runs without torch, numpy, transformers, gliner2 or Prefect (``tests/test_layers.py`` walks every
module's imports, lazy ones included): the training configuration (``config``), records (``records`` +
``record_checks`` + ``canonical``), the content-addressed plan (``plan`` + ``plan_order`` + ``plan_types``) and its
manifest (``manifest``), storage (``storage`` + ``commits`` + ``tempcopies`` + ``durability`` + ``direct_io``), the
run directory's names (``layout``), the checkpoint file format (``checkpoint/``), annotation formats in and out
(``formats/``: CoNLL/BIO, spaCy, Label Studio, doccano), scoring and evaluation over any
extractor (``scoring``, ``evaluation``, ``metrics``, ``label_order``), extraction thresholds and their fit
(``thresholds``, ``threshold_fit``), promotion statistics (``promotion``, ``promotion_rule``,
``promotion_report``, ``bootstrap``) and the exception tree (``errors``).

The torch layer over gliner2's native trainer (``TrainingSession``, ``ManagedTraining``, weights, the engine
adapter, the tiny offline models) is ``prefect_gliner2.training``, which imports this package, never the reverse.
The session names are still reachable here for code written before the split, with a DeprecationWarning.

Exceptions: one tree, drawn in ``prefect_gliner2.session_core.errors``; the deterministic errors of planning and
the session are defined there and re-exported here.
"""

from __future__ import annotations

if __name__ != "prefect_gliner2.session_core":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.session_core, not {__name__}: a second copy would split every class")

import importlib
import warnings
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

#: Names that moved to the torch layer, ``prefect_gliner2.training``; kept reachable here (with a warning) so code
#: written before the split still runs. The one place this package names the layer above it (tests/test_layers.py).
MOVED_TO_TRAINING = frozenset({"InputExample", "ManagedTraining", "TrainingSession", "load_exported_model"})

__all__ = [
    "AdapterMismatchError",
    "CheckpointDamagedError",
    "CheckpointError",
    "ConfigError",
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
    "TransientError",
    "WeightsError",
]


def __getattr__(name: str) -> Any:
    if name not in MOVED_TO_TRAINING:
        raise AttributeError(f"module 'prefect_gliner2.session_core' has no attribute {name!r}")
    warnings.warn(
        f"prefect_gliner2.session_core.{name} moved to the torch layer: import it from prefect_gliner2.training",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("prefect_gliner2.training"), name)
