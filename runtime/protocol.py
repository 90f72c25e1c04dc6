"""The session worker protocol: every message that crosses the pipe, as frozen dataclasses (torch-free).

    flow process                                   worker process
    Init(spec, restore)                     ->     Reply(0, StatusResult | RemoteError)
    Call(op_id, Advance(first, through))    ->     Reply(op_id, AdvanceResult | RemoteError)
    Call(op_id, Validate(index))            ->     Reply(op_id, ValidateResult | RemoteError)
    Call(op_id, Checkpoint(index, uri))     ->     Reply(op_id, CheckpointResult | RemoteError)
    Call(op_id, Checkpoint(index, uri, background=True))  ->  CheckpointResult(pending=True): snapshot taken,
                                                   the write runs in the worker's background thread
    Call(op_id, CommitCheckpoint(index, uri))  ->  CheckpointResult once that write is durable (or its error)
    Call(op_id, Export(uri, which))         ->     Reply(op_id, ExportResult | RemoteError)
    Call(op_id, Status()) / Call(op_id, Summary())  ->  StatusResult / SummaryResult
    Call(op_id, Score(models, base_model, data, config))  ->  ScoreResult (a finished run: its session released)
    Close()                                 ->     (the worker releases its session and exits)

Requests are hashable values (the client joins an identical request sent ahead instead of sending it twice;
``Score``, never sent ahead, by identity).
Results are small, picklable records that Prefect tasks may return and persist. A failure comes back as a
``RemoteError``: a ``SessionCoreError`` keeps its class and fields (its constructor arguments and attributes cross
the pipe) and gets the remote traceback attached; any other exception becomes ``WorkerError`` naming its type.
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from prefect_gliner2.runtime.errors import StorageFullError, WorkerError, permanent_storage_errno, storage_full_error
from prefect_gliner2.runtime.faults import FaultPlan
from prefect_gliner2.session_core.errors import SessionCoreError
from prefect_gliner2.session_core.thresholds import THRESHOLDS_KEY

__all__ = [
    "Advance",
    "AdvanceResult",
    "Call",
    "Checkpoint",
    "CheckpointResult",
    "Close",
    "CommitCheckpoint",
    "Export",
    "ExportResult",
    "Init",
    "RemoteError",
    "Reply",
    "Request",
    "Result",
    "Score",
    "ScoreResult",
    "Status",
    "StatusResult",
    "Summary",
    "SummaryResult",
    "Validate",
    "ValidateResult",
    "WorkerSpec",
    "decode_error",
    "encode_error",
]

#: The modules whose SessionCoreError subclasses are rebuilt in the client: every errors home that can define one
#: (torch-free and Prefect-free; ``flows.sweep`` defines only a TransientError, which is never rebuilt).
REMOTE_ERROR_MODULES = (
    "prefect_gliner2.session_core.errors",
    "prefect_gliner2.runtime.errors",
    "prefect_gliner2.model_registry.store",
)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its session: small, picklable, no torch objects."""

    model: str
    manifest_uri: str
    cpu_threads: int = 1
    device: str | None = None
    init_weights: str | None = None  # weights a fresh run starts from (not applied when restoring a checkpoint)
    faults: FaultPlan | None = None  # test fault injection at worker-side points; always None in production


# ---- results -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusResult:
    pid: int
    cursor: int
    step: int
    finished: bool
    validation_due: bool
    stopped_early: bool
    restored_from: str | None
    cpu_threads: int
    device: str
    batch_count: int
    pending_checkpoint: str | None = None  # the uri of the one background checkpoint write in flight, if any
    # the worker's start: (phase, seconds after its entry point) as they happened: "run" (its run arrived),
    # "prefetch" (the checkpoint's background read began; a restore only), "imported" (torch, transformers,
    # gliner2), "ready" (built and restored); a spare imports before its run arrives, a spawned worker after
    start: tuple[tuple[str, float], ...] = ()

    def start_text(self) -> str:
        """`start` as the logs print it: "run 0.88, prefetch 0.88, imported 3.53, ready 3.68"."""
        return ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in self.start)


@dataclass(frozen=True)
class AdvanceResult:
    first: int
    through: int
    cursor: int
    step: int
    epoch: int
    replayed: int  # batches replayed before `first` (after a restore)
    stopped_early: bool
    updates: tuple[dict[str, Any], ...]  # the update metrics of batches first..through
    trained: int = 0  # batches this operation trained (replayed ones included; 0 when already past)
    seconds: float = 0.0  # the worker's seconds training them (validation excluded): the step time, measured


@dataclass(frozen=True)
class ValidateResult:
    index: int
    metrics: dict[str, Any] | None
    best_metric: float | None
    best_step: int | None
    stopped_early: bool
    step: int
    history: tuple[dict[str, Any], ...]  # every validation so far


@dataclass(frozen=True)
class CheckpointResult:
    uri: str
    index: int
    cursor: int
    step: int
    epoch: int
    finished: bool
    stopped_early: bool
    best_metric: float | None
    best_step: int | None
    committed: bool
    reason: str | None = None  # why nothing was written (committed False)
    existing: bool | None = None  # the checkpoint was already there (a repeated operation)
    index_sha256: str | None = None
    name: str | None = None  # set by the checkpoint task
    cursor_moved: bool | None = None  # set by the checkpoint task: the durable cursor moved to this checkpoint
    pruned: tuple[str, ...] = ()  # set by the checkpoint task: older checkpoints removed by retention
    pending: bool = False  # a background write of this checkpoint is in flight (committed False until it ends)


@dataclass(frozen=True)
class SummaryResult:
    total_steps: int
    total_epochs: int
    total_time_seconds: float
    samples_per_second: float
    best_metric: float
    best_step: int | None
    eval_metrics_history: tuple[dict[str, Any], ...]
    stopped_early: bool
    cursor: int
    plan_fingerprint: str
    train_metrics_history: tuple[dict[str, Any], ...] = ()  # only when asked (Summary(train_history=True))

    @classmethod
    def from_native(cls, result: dict[str, Any], *, train_history: bool = False) -> SummaryResult:
        """From ``ManagedTraining.result()`` (its per-step training history only with `train_history`: it can be
        large)."""
        return cls(
            total_steps=result["total_steps"],
            total_epochs=result["total_epochs"],
            total_time_seconds=result["total_time_seconds"],
            samples_per_second=result["samples_per_second"],
            best_metric=result["best_metric"],
            best_step=result["best_step"],
            eval_metrics_history=tuple(result["eval_metrics_history"]),
            stopped_early=result["stopped_early"],
            cursor=result["cursor"],
            plan_fingerprint=result["plan_fingerprint"],
            train_metrics_history=tuple(result["train_metrics_history"]) if train_history else (),
        )


@dataclass(frozen=True)
class ExportResult:
    uri: str
    label: str  # "best" or "final"
    step: int
    architecture: str
    lora: bool
    merged: bool
    base_model_hash: str | None
    weights_sha256: str
    summary: SummaryResult
    thresholds: dict[str, Any] | None = None  # Thresholds.to_dict() fitted on validation data, if any

    @classmethod
    def from_record(cls, record: dict[str, Any], uri: str, label: str, summary: SummaryResult) -> ExportResult:
        """From the export record (``export_weights``' return value, or an existing export's export.json)."""
        return cls(
            uri=uri,
            label=label,
            step=record["step"],
            architecture=record["architecture"],
            lora=record["lora"],
            merged=record["merged"],
            base_model_hash=record.get("base_model_hash"),
            weights_sha256=record["weights_sha256"],
            summary=summary,
            thresholds=record.get(THRESHOLDS_KEY),
        )


# ---- requests ----------------------------------------------------------------------------------------------


R = TypeVar("R", covariant=True)


@dataclass(frozen=True)
class Request(Generic[R]):
    """Base of the operations a worker executes; `R` is its result type, `op` names it in messages."""

    op: ClassVar[str] = "request"


@dataclass(frozen=True)
class Status(Request[StatusResult]):
    """Where the session stands (no work)."""

    op: ClassVar[str] = "status"


@dataclass(frozen=True)
class Advance(Request[AdvanceResult]):
    """Train (and validate when due) until the cursor is past `through`; `first` is this task's first batch."""

    op: ClassVar[str] = "advance"
    first: int
    through: int


@dataclass(frozen=True)
class Validate(Request[ValidateResult]):
    """The validation due after batch `index` (advancing to it first)."""

    op: ClassVar[str] = "validate"
    index: int


@dataclass(frozen=True)
class Checkpoint(Request[CheckpointResult]):
    """A managed checkpoint after batch `index`, written to `uri` (advancing to it first)."""

    op: ClassVar[str] = "checkpoint"
    index: int
    uri: str
    background: bool = False  # snapshot, then write in the background: the result is pending until committed


@dataclass(frozen=True)
class CommitCheckpoint(Request[CheckpointResult]):
    """Wait until the background write of the checkpoint at `uri` (batch `index`) is durable and report it
    committed; its failure is raised. With no such write in this worker: a ``Checkpoint(index, uri)``."""

    op: ClassVar[str] = "commit-checkpoint"
    index: int
    uri: str


@dataclass(frozen=True)
class Export(Request[ExportResult]):
    """Export the `which` ("best" or "final") model to `uri` once the plan is done (advancing to its end first)."""

    op: ClassVar[str] = "export"
    uri: str
    which: str = "best"


@dataclass(frozen=True)
class Summary(Request[SummaryResult]):
    """The native summary; the per-step training history only with `train_history` (a resumed run's curves start
    from the history the worker restored, so the flow process never reads a checkpoint's payload)."""

    train_history: bool = False
    op: ClassVar[str] = "summary"


@dataclass(frozen=True, eq=False)
class Score(Request["ScoreResult"]):
    """Once the run is finished: release its session, then score model directories for promotion in this worker
    (``runtime.compare.score_sessions_here``'s arguments): the retraining flow's comparison (``runtime.handover``)."""

    op: ClassVar[str] = "score"
    __eq__ = object.__eq__  # keyed by identity in the worker client (its dict fields are not hashable)
    __hash__ = object.__hash__
    models: dict[str, str | None]
    base_model: str
    data: dict[str, str | list[str]]
    config: dict[str, Any]
    cpu_threads: int = 1
    device: str | None = None


@dataclass(frozen=True)
class ScoreResult:
    scores: dict[str, dict[str, dict[str, Any]]]  # score_sessions_here's {set: {role: scores}}


@dataclass(frozen=True)
class Close:
    """Release the session and exit."""


@dataclass(frozen=True)
class Init:
    """The first message: build the session from `spec`, restoring checkpoint `restore` when given."""

    spec: WorkerSpec
    restore: str | None


@dataclass(frozen=True)
class Call:
    op_id: int
    request: Request


Result = StatusResult | AdvanceResult | ValidateResult | CheckpointResult | ExportResult | SummaryResult | ScoreResult


# ---- failures ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteError:
    """An exception raised in the worker: its type, message, traceback text and, for our own error classes,
    the constructor arguments and attributes that rebuild it."""

    module: str
    type: str
    message: str
    traceback: str
    args: tuple[Any, ...] | None = None
    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reply:
    op_id: int
    result: Result | RemoteError


def encode_error(exc: BaseException, pid: int) -> RemoteError:
    """The RemoteError for `exc`; a full / size-limited / read-only storage becomes StorageFullError first."""
    remote_traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    code = permanent_storage_errno(exc)
    if code is not None and not isinstance(exc, StorageFullError):
        exc = storage_full_error(code, f"{type(exc).__name__} in session worker pid {pid}: {exc}")
    cls = type(exc)
    args: tuple[Any, ...] | None = None
    state: dict[str, Any] | None = None
    if isinstance(exc, SessionCoreError) and cls.__module__ in REMOTE_ERROR_MODULES:
        reduced = exc.__reduce__()
        if isinstance(reduced, tuple) and reduced[0] is cls:
            args = tuple(reduced[1])
            state = dict(reduced[2]) if len(reduced) > 2 and isinstance(reduced[2], dict) else None
    return RemoteError(cls.__module__, cls.__qualname__, str(exc), remote_traceback, args, state)


def decode_error(remote: RemoteError, pid: int | None) -> BaseException:
    """The exception to raise in the client for `remote` (see the module docstring)."""
    rebuilt = _rebuild(remote)
    if rebuilt is not None:
        rebuilt.remote_traceback = remote.traceback  # type: ignore[attr-defined]
        rebuilt.add_note(f"raised in session worker pid {pid}; remote traceback:\n{remote.traceback.rstrip()}")
        return rebuilt
    name = remote.type if remote.module == "builtins" else f"{remote.module}.{remote.type}"
    return WorkerError(
        f"{name} in session worker pid {pid}: {remote.message}; the worker was discarded and a retry "
        "restarts it from the newest committed checkpoint",
        remote.traceback,
        remote_type=name,
    )


def _rebuild(remote: RemoteError) -> BaseException | None:
    if remote.args is None or remote.module not in REMOTE_ERROR_MODULES:
        return None
    cls = getattr(importlib.import_module(remote.module), remote.type, None)
    if not (isinstance(cls, type) and issubclass(cls, SessionCoreError)):
        return None
    try:
        exc = cls(*remote.args)
    except TypeError:
        return None
    if remote.state:
        exc.__dict__.update(remote.state)
    return exc
