"""One exception hierarchy for the whole product; every class is also a stdlib error.

    SessionCoreError                      base of everything we raise on purpose
    ├── ConfigError (ValueError)          a TrainingConfig field is invalid or unsupported
    ├── RecordError (ValueError)          training/validation records are invalid (row index + reason)
    ├── ManifestError (ValueError)        a manifest is malformed, edited or of an unknown schema
    ├── PlanMismatchError (ValueError)    a checkpoint or run key belongs to a different plan
    ├── PrecisionError (RuntimeError)     a precision the hardware or the session cannot honour
    ├── CheckpointError (RuntimeError)    a checkpoint is missing, truncated, edited or incomplete
    │   └── CheckpointDamagedError        its files differ from its index (hash, size, missing): use an earlier one
    ├── StateMismatchError (ValueError)   load_state on a session whose config/model/device differs
    ├── WeightsError (ValueError)         load_weights/export_weights input is wrong for this model
    ├── AdapterMismatchError (WeightsError) a preloaded/loaded LoRA adapter differs from the config
    ├── SessionStateError (RuntimeError)  an operation in the wrong order (closed, past max_steps, not fresh)
    └── TrainingNumericsError (FloatingPointError) non-finite loss/gradients, or a loss without grad

Messages say what was wrong and what to do. Deterministic errors (everything above) must not be retried.
"""

from __future__ import annotations

__all__ = [
    "BF16_NEEDS_CUDA",
    "EARLY_STOPPING_NEEDS_VALIDATION",
    "AdapterMismatchError",
    "CheckpointDamagedError",
    "CheckpointError",
    "ConfigError",
    "ManifestError",
    "PlanMismatchError",
    "PrecisionError",
    "RecordError",
    "SessionCoreError",
    "SessionStateError",
    "StateMismatchError",
    "TrainingNumericsError",
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


class SessionCoreError(Exception):
    """Base class of every error this product raises on purpose (deterministic: retrying will not help)."""


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
    """A checkpoint's files differ from its index (sha256, size, a file or the index missing or unreadable): the
    bytes were damaged after the commit. A run falls back to its previous intact checkpoint."""


class StateMismatchError(SessionCoreError, ValueError):
    """load_state was asked to restore into a session whose configuration, model or device differs."""


class WeightsError(SessionCoreError, ValueError):
    """Weights given to load_weights (or asked of export_weights) do not fit this model."""


class AdapterMismatchError(WeightsError):
    """A LoRA adapter's rank, alpha, dropout, targets or DoRA setting differ from the configuration."""


class SessionStateError(SessionCoreError, RuntimeError):
    """An operation was called in a state that does not allow it (closed, past max_steps, not fresh)."""


class TrainingNumericsError(SessionCoreError, FloatingPointError):
    """A non-finite loss or gradient, or a loss that does not require grad while parameters are trainable."""
