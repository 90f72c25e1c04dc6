"""Every exception the product raises on purpose, in one tree; each class is also a stdlib error and pickles.

    PrefectGliner2Error                        base of everything we raise on purpose
    ├── SessionCoreError                       deterministic: retrying will not help, so it is never retried
    │   ├── ConfigError (ValueError)           a TrainingConfig field is invalid or unsupported
    │   │   └── RunKeyError                    a run key that is not a safe directory name               [runtime]
    │   ├── RecordError (ValueError)           training/validation records are invalid (row index + reason)
    │   │   └── FormatError                    an annotation file (CoNLL, spaCy, Label Studio, doccano) is unreadable
    │   ├── ManifestError (ValueError)         a manifest is malformed, edited or of an unknown schema
    │   ├── PlanMismatchError (ValueError)     a checkpoint or run key belongs to a different plan
    │   │   └── RunConflictError               a different manifest / settings under an existing run key [runtime]
    │   ├── PrecisionError (RuntimeError)      a precision the hardware or the session cannot honour
    │   ├── CheckpointError (RuntimeError)     a checkpoint is missing, truncated, edited or incomplete
    │   │   └── CheckpointDamagedError         its files differ from its index (hash, size, missing): use an earlier one
    │   ├── StateMismatchError (ValueError)    load_state on a session whose config/model/device differs
    │   ├── WeightsError (ValueError)          load_weights/export_weights input is wrong for this model
    │   │   └── DeadCountHeadError             a span model whose count head predicts 0 for every label (pre-flight)
    │   │   └── AdapterMismatchError           a preloaded/loaded LoRA adapter differs from the config
    │   ├── SessionStateError (RuntimeError)   an operation in the wrong order (closed, past max_steps, not fresh)
    │   ├── TrainingNumericsError (FloatingPointError)  non-finite loss/gradients, or a loss without grad
    │   ├── ParityError (RuntimeError)         an ONNX export outside the parity gate's tolerance (its figures)
    │   ├── RegistryError (ValueError)         a registry name, version or pointer is invalid or missing  [registry]
    │   ├── RunLockedError (RuntimeError)      another live run holds the run key's lease                 [runtime]
    │   └── StorageFullError (OSError)         a write failed with ENOSPC, EFBIG, EDQUOT or EROFS        [runtime]
    └── TransientError (RuntimeError)          a retry may help
        ├── WorkerDied                         the session worker process vanished (kill, OOM, segfault)  [runtime]
        ├── WorkerError                        an unexpected (not ours) exception inside the worker       [runtime]
        ├── LeaseUnreadableError               the lease record could not be read: never "free"           [runtime]
        └── SweepIncompleteError               some sweep points did not complete: a retry retries them   [flows]

Each class is defined in the layer that raises it: unmarked ones here (planning and the training session), [runtime]
in ``prefect_gliner2.runtime.errors`` (the run: its key, lease, worker and storage), [registry] in
``prefect_gliner2.model_registry.store``, [flows] in ``prefect_gliner2.flows.sweep``. All derive from the bases here,
so the tree stays one tree; ``prefect_gliner2`` exports the common ones.

Messages say what was wrong and what to do. ``prefect_gliner2.runtime.errors.is_transient`` is the retry rule: never
a SessionCoreError (nor a write to a full or read-only storage), otherwise yes. Every class pickles with its fields:
they cross the session worker's pipe and Prefect's result store. The command line's own errors
(``prefect_gliner2.flows.cli``: ``UsageError``, ``LocalServerError`` when its local Prefect server does not start,
``Terminated`` for a SIGTERM outside a flow run) are caught and printed by its ``main`` and are not part of this
tree.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BF16_NEEDS_CUDA",
    "EARLY_STOPPING_NEEDS_VALIDATION",
    "AdapterMismatchError",
    "CheckpointDamagedError",
    "CheckpointError",
    "ConfigError",
    "DeadCountHeadError",
    "FormatError",
    "ManifestError",
    "ParityError",
    "PlanMismatchError",
    "PrecisionError",
    "PrefectGliner2Error",
    "RecordError",
    "SessionCoreError",
    "SessionStateError",
    "StateMismatchError",
    "TrainingNumericsError",
    "TransientError",
    "WeightsError",
]

# Refusals checked in two places (the session, and the flow before any task runs): one wording.
BF16_NEEDS_CUDA = (
    "bf16=True needs a CUDA device with native bf16; CPU mixed precision is refused instead of silently falling "
    "back to fp32. Pass bf16=False to train in fp32 on CPU."
)
EARLY_STOPPING_NEEDS_VALIDATION = (
    "early_stopping=True needs eval_examples; pass validation records or disable early stopping"
)


class PrefectGliner2Error(Exception):
    """Base class of every error this product raises on purpose (see the tree in the module docstring)."""


# ---- deterministic ---------------------------------------------------------------------------------------------


class SessionCoreError(PrefectGliner2Error):
    """Base class of the deterministic errors: retrying will not help, so they are never retried."""


class ConfigError(SessionCoreError, ValueError):
    """A TrainingConfig field is invalid or asks for something the session refuses."""


class RecordError(SessionCoreError, ValueError):
    """Training or validation records are invalid; the message lists row indices and reasons."""


class FormatError(RecordError):
    """An annotation file cannot be read or written in its format; the message names file, line or record, offset
    and what to do."""


class ManifestError(SessionCoreError, ValueError):
    """A manifest is malformed, was edited after it was written, or has an unknown schema version."""


class PlanMismatchError(SessionCoreError, ValueError):
    """A checkpoint, cursor or run key belongs to a different plan than the one requested."""


class PrecisionError(SessionCoreError, RuntimeError):
    """A precision request the hardware or the session cannot honour exactly (never silently downgraded)."""


class CheckpointError(SessionCoreError, RuntimeError):
    """A checkpoint is missing, truncated, edited, incomplete, or uses a forbidden format."""


class CheckpointDamagedError(CheckpointError):
    """A checkpoint's files differ from its index (digest, size, a file or the index missing or unreadable): the
    bytes were damaged after the commit. A run falls back to its previous intact checkpoint."""


class StateMismatchError(SessionCoreError, ValueError):
    """load_state was asked to restore into a session whose configuration, model or device differs."""


class WeightsError(SessionCoreError, ValueError):
    """Weights given to load_weights (or asked of export_weights) do not fit this model."""


class DeadCountHeadError(WeightsError):
    """A span model's count head predicts 0 instances for every label, so it extracts nothing at any threshold
    (found by the pre-flight before training; ``prefect-gliner2 init-model`` or ``repair_count_head`` fix it)."""


class AdapterMismatchError(WeightsError):
    """A LoRA adapter's rank, alpha, dropout, targets or DoRA setting differ from the configuration."""


class SessionStateError(SessionCoreError, RuntimeError):
    """An operation was called in a state that does not allow it (closed, past max_steps, not fresh)."""


class TrainingNumericsError(SessionCoreError, FloatingPointError):
    """A non-finite loss or gradient, or a loss that does not require grad while parameters are trainable."""


class ParityError(SessionCoreError, RuntimeError):
    """An ONNX export whose graphs do not extract what the torch model extracts, within the precision's tolerance;
    `reports` holds the gate's figures per precision (``session_core.onnx_parity``). Nothing was published."""

    def __init__(self, message: str, reports: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.reports = list(reports or [])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.reports), dict(self.__dict__))


# ---- transient -------------------------------------------------------------------------------------------------


class TransientError(PrefectGliner2Error, RuntimeError):
    """Base class of the errors a retry may cure (a worker that died, a lease that could not be read)."""
