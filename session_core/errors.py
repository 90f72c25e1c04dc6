"""Every exception the product raises on purpose, in one tree; each class is also a stdlib error and pickles.

    PrefectGliner2Error                        base of everything we raise on purpose
    ├── SessionCoreError                       deterministic: retrying will not help, so it is never retried
    │   ├── ConfigError (ValueError)           a TrainingConfig field is invalid or unsupported
    │   │   └── RunKeyError                    a run key that is not a safe directory name
    │   ├── RecordError (ValueError)           training/validation records are invalid (row index + reason)
    │   ├── ManifestError (ValueError)         a manifest is malformed, edited or of an unknown schema
    │   ├── PlanMismatchError (ValueError)     a checkpoint or run key belongs to a different plan
    │   │   └── RunConflictError               a different manifest / settings under an existing run key
    │   ├── PrecisionError (RuntimeError)      a precision the hardware or the session cannot honour
    │   ├── CheckpointError (RuntimeError)     a checkpoint is missing, truncated, edited or incomplete
    │   │   └── CheckpointDamagedError         its files differ from its index (hash, size, missing): use an earlier one
    │   ├── StateMismatchError (ValueError)    load_state on a session whose config/model/device differs
    │   ├── WeightsError (ValueError)          load_weights/export_weights input is wrong for this model
    │   │   └── DeadCountHeadError             a span model whose count head predicts 0 for every label (pre-flight)
    │   │   └── AdapterMismatchError           a preloaded/loaded LoRA adapter differs from the config
    │   ├── SessionStateError (RuntimeError)   an operation in the wrong order (closed, past max_steps, not fresh)
    │   ├── TrainingNumericsError (FloatingPointError)  non-finite loss/gradients, or a loss without grad
    │   ├── RegistryError (ValueError)         a model registry name, version or pointer is invalid or missing
    │   ├── RunLockedError (RuntimeError)      another live run holds the run key's lease
    │   ├── ParityError (RuntimeError)         an ONNX export outside the parity gate's tolerance (its figures)
    │   └── StorageFullError (OSError)         a write failed with ENOSPC, EFBIG, EDQUOT or EROFS (any process)
    └── TransientError (RuntimeError)          a retry may help
        ├── WorkerDied                         the session worker process vanished (kill, OOM, segfault)
        ├── WorkerError                        an unexpected (not ours) exception inside the worker; it was discarded
        ├── LeaseUnreadableError               the lease record could not be read: never taken as "free"
        └── SweepIncompleteError               some sweep points did not complete: retrying the sweep retries them

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
    "LeaseUnreadableError",
    "ManifestError",
    "ParityError",
    "PlanMismatchError",
    "PrecisionError",
    "PrefectGliner2Error",
    "RecordError",
    "RegistryError",
    "RunConflictError",
    "RunKeyError",
    "RunLockedError",
    "SessionCoreError",
    "SessionStateError",
    "StateMismatchError",
    "StorageFullError",
    "SweepIncompleteError",
    "TrainingNumericsError",
    "TransientError",
    "WeightsError",
    "WorkerDied",
    "WorkerError",
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


class RegistryError(SessionCoreError, ValueError):
    """A registry name, version or pointer is invalid or missing."""


class RunKeyError(ConfigError):
    """A run key that cannot name a run directory safely."""


class RunConflictError(PlanMismatchError):
    """The run key already holds a run with a different manifest or different run settings."""


class RunLockedError(SessionCoreError, RuntimeError):
    """Another live flow run holds the lease on this run key."""


class ParityError(SessionCoreError, RuntimeError):
    """An ONNX export whose graphs do not extract what the torch model extracts, within the precision's tolerance;
    `reports` holds the gate's figures per precision (``session_core.onnx_parity``). Nothing was published."""

    def __init__(self, message: str, reports: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.reports = list(reports or [])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.reports), dict(self.__dict__))


class StorageFullError(SessionCoreError, OSError):
    """A write failed because the storage is full, past a file-size or quota limit, or read-only: not retried."""

    def __init__(self, code: int, message: str) -> None:
        OSError.__init__(self, code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errno, self.message), dict(self.__dict__))


# ---- transient -------------------------------------------------------------------------------------------------


class TransientError(PrefectGliner2Error, RuntimeError):
    """Base class of the errors a retry may cure (a worker that died, a lease that could not be read)."""


class WorkerDied(TransientError):
    """The session worker process died; a retry starts a fresh one from the newest committed checkpoint."""


class WorkerError(TransientError):
    """An unexpected exception inside the worker (not one of ours); the worker was discarded."""

    def __init__(self, message: str, remote_traceback: str = "", remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback
        self.remote_type = remote_type  # the exception's type in the worker, e.g. "RuntimeError"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.remote_traceback, self.remote_type), dict(self.__dict__))


class LeaseUnreadableError(TransientError):
    """The run key's lease record could not be read or listed: the key is not treated as free."""


class SweepIncompleteError(TransientError):
    """Some points of a sweep did not complete (transient: retrying the sweep retries them)."""
