"""ManagedTraining: run a ManagedTrainingPlan through a session's public operations, with validation,
best-checkpoint selection, early stopping and exact managed checkpoints.

The driver is the plan's own contract and nothing more: for each batch i, `session.forward_backward(plan.batch(i))`
(as `queue_forward_backward`: the same operation, its loss read with the update's scalars instead of at once),
then `session.optim_step()` iff `plan.is_update(i)`; after a validation batch, the eval losses of the validation
examples via `session.forward` and, with ``eval_extraction``, precision/recall/F1 of gliner2's own batched
extraction via `session.extract` (`evaluation.evaluate_session`; no RNG draw, no mode leak, no file written).
So a managed run equals a caller's own loop bit for bit. Selection and early stopping follow gliner2's native
semantics: a validation is "best" when strictly better than the best so far; early stopping counts validations
that do not beat the previous best by more than `early_stopping_threshold` and stops once
`early_stopping_patience` such validations follow each other.

A managed checkpoint is a session checkpoint plus `managed.json` (plan fingerprint, cursor, validation state,
histories, early-stopping counters) and a reference to `best.safetensors` (the detached CPU copy of the best
weights), stored once in the content-addressed blob store beside the checkpoints and named by every checkpoint
taken while it is the best: a new best is written once, not copied into each checkpoint. Training
history entries hold no wall-clock fields, so an interrupted and resumed run has the same history bit for bit;
timings live in the result summary only.

Background checkpoints split `save_state` in two: `prepare_checkpoint` snapshots the state at the step boundary
(detached host copies), `write_prepared` writes that snapshot, from any thread, while training continues.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prefect_gliner2.session_core.checkpoint import FileRef, Payload, open_checkpoint, store_blob, write_checkpoint
from prefect_gliner2.session_core.errors import (
    EARLY_STOPPING_NEEDS_VALIDATION,
    ConfigError,
    PlanMismatchError,
    SessionStateError,
)
from prefect_gliner2.session_core.evaluation import evaluate_session
from prefect_gliner2.session_core.layout import BEST_WEIGHTS_FILE, MANAGED_STATE_FILE
from prefect_gliner2.session_core.metrics import EVAL_KEYS, LOSS_KEYS
from prefect_gliner2.session_core.plan import ManagedTrainingPlan
from prefect_gliner2.session_core.thresholds import Thresholds
from prefect_gliner2.training import managed_export
from prefect_gliner2.training.native_save import SameBytes
from prefect_gliner2.training.session import TrainingSession
from prefect_gliner2.training.session_checkpoint import tensor_file
from prefect_gliner2.training.state import write_tensors

MANAGED_KIND = "managed"
StepCallback = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True)
class PreparedCheckpoint:
    """A managed checkpoint snapshotted at a step boundary, not written yet (``ManagedTraining.prepare_checkpoint``):
    its files read only detached copies, and `best` is the best-weights dict of that moment (or None)."""

    uri: str
    files: dict[str, Payload]
    meta: dict[str, Any]
    best: dict[str, torch.Tensor] | None


class ManagedTraining:
    """The managed driver (see module docstring). One instance drives one session through one plan."""

    def __init__(self, session: TrainingSession, plan: ManagedTrainingPlan, eval_examples: Any = None) -> None:
        if session.max_steps != plan.max_steps:
            raise PlanMismatchError(
                f"session max_steps {session.max_steps} != plan.max_steps {plan.max_steps}; create the session with "
                "TrainingSession(model, config, max_steps=plan.max_steps)"
            )
        if session.architecture != plan.architecture:
            raise PlanMismatchError(
                f"the plan is for a {plan.architecture!r} model, the session trains {session.architecture!r}"
            )
        self.session = session
        self.plan = plan
        self.config = session.config
        self._eval_batches = managed_export.eval_batches(eval_examples, self.config.eval_batch_size)
        self._eval_hash = managed_export.records_hash(self._eval_batches)
        self._check_selection()
        self.cursor = 0
        self.validation_due = False
        self.stopped_early = False
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        # where best_state is stored, as (that very dict, its blob): a new best (a new dict) is not stored yet
        self._best_stored: tuple[dict[str, torch.Tensor], FileRef] | None = None
        self.patience_counter = 0
        self.train_metrics_history: list[dict[str, Any]] = []
        self.eval_metrics_history: list[dict[str, Any]] = []
        self._window_loss = 0.0
        self._elapsed = 0.0
        self._samples = 0

    # ---- progress ---------------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True when the plan is exhausted (and its last validation done) or early stopping fired."""
        return self.stopped_early or (self.cursor >= self.plan.batch_count and not self.validation_due)

    @property
    def has_best(self) -> bool:
        """True when validation selected best weights (kept as a detached CPU copy)."""
        return self.best_state is not None

    def run(self, on_step: StepCallback | None = None, *, until: int | None = None) -> dict[str, Any]:
        """Train to the end of the plan (or early stop, or batch index `until`); returns the native summary."""
        stop = self.plan.batch_count if until is None else min(until, self.plan.batch_count)
        while not self.stopped_early:
            if self.validation_due:
                evaluated = self.validate()
                if on_step is not None:
                    on_step(self.session.step, evaluated)
                continue
            if self.cursor >= stop:
                break
            trained = self.train_batch()
            if trained is not None and on_step is not None:
                on_step(self.session.step, trained)
        return self.result()

    def train_batch(self) -> dict[str, Any] | None:
        """Run the batch at the cursor (and its update); returns the update's metrics, else None."""
        if self.stopped_early or self.cursor >= self.plan.batch_count:
            raise SessionStateError("the managed run is finished; nothing left to train")
        if self.validation_due:
            raise SessionStateError(f"validation after batch {self.cursor - 1} is due; call validate() first")
        started = time.perf_counter()
        index = self.cursor
        batch = self.plan.batch(index)
        self.session.queue_forward_backward(batch)  # its loss is read with the update's scalars: no host wait
        self._samples += len(batch.rows)
        metrics: dict[str, Any] | None = None
        if self.plan.is_update(index):
            step_metrics = self.session.optim_step()
            self._fold_losses()
            metrics = self._after_update(index, step_metrics)
        self.cursor = index + 1
        self.validation_due = bool(self.plan.is_validation(index)) and bool(self._eval_batches)
        self._elapsed += time.perf_counter() - started
        return metrics

    def _fold_losses(self) -> None:
        """Add the losses of the batches trained since the last fold to the logging window, in batch order."""
        for loss in self.session.take_losses():
            self._window_loss += loss

    def _after_update(self, index: int, step_metrics: dict[str, float]) -> dict[str, Any] | None:
        step = int(step_metrics["step"])
        if step % self.config.logging_steps != 0:
            return None
        entry = {
            "loss": self._window_loss / max(self.config.logging_steps, 1),
            "classification_loss": step_metrics.get("classification_loss", 0.0),
            "structure_loss": step_metrics.get("structure_loss", 0.0),
            "count_loss": step_metrics.get("count_loss", 0.0),
            "learning_rate": step_metrics["learning_rate"],
            "grad_norm": step_metrics["grad_norm"],
            "epoch": self.plan.epoch(index) + (index % self.plan.batches_per_epoch) / self.plan.batches_per_epoch,
            "step": step,
            "batch": index,
            "samples_seen": self.session.samples_seen,
        }
        self._window_loss = 0.0
        self.train_metrics_history.append(entry)
        return entry

    def validate(self) -> dict[str, Any]:
        """Validation at a due boundary: native eval losses and extraction P/R/F1, best selection, early stopping."""
        if not self.validation_due:
            raise SessionStateError("no validation is due at this cursor")
        started = time.perf_counter()
        metrics = evaluate_session(
            self.session,
            self._eval_batches,
            extraction=bool(self.config.eval_extraction),
            threshold=float(self.config.eval_threshold),
            seed=int(self.config.seed),
            label_order_trials=int(self.config.label_order_trials),
        )
        metrics.update(step=self.session.step, epoch=self.plan.epoch(self.cursor - 1), batch=self.cursor - 1)
        self.eval_metrics_history.append(metrics)
        self._select(metrics)
        self.validation_due = False
        self._elapsed += time.perf_counter() - started
        return metrics

    def _select(self, metrics: dict[str, Any]) -> None:
        value = float(metrics[str(self.config.metric_for_best)])
        greater = bool(self.config.greater_is_better)
        previous = self.best_metric
        if previous is None or (value > previous if greater else value < previous):
            self.best_metric, self.best_step = value, self.session.step
            if self.config.save_best:
                self.best_state = self._detached_weights()  # a new dict: a pending snapshot keeps the old one
        if not self.config.early_stopping:
            return
        threshold = float(self.config.early_stopping_threshold)
        reference = previous if previous is not None else (-math.inf if greater else math.inf)
        improved = value > reference + threshold if greater else value < reference - threshold
        self.patience_counter = 0 if improved else self.patience_counter + 1
        if self.patience_counter >= self.config.early_stopping_patience:
            self.stopped_early = True

    def _detached_weights(self) -> dict[str, torch.Tensor]:
        model = self.session.model
        if self.session.is_lora:
            items = {n: p for n, p in model.named_parameters() if p.requires_grad}
        else:
            items = dict(model.state_dict())
        return {n: t.detach().to("cpu", copy=True) for n, t in items.items()}

    def result(self) -> dict[str, Any]:
        """gliner2's native summary keys (plus where the run stands)."""
        last = min(self.cursor, self.plan.batch_count) - 1
        greater = bool(self.config.greater_is_better)
        best = self.best_metric if self.best_metric is not None else (-math.inf if greater else math.inf)
        return {
            "total_steps": self.session.step,
            "total_epochs": (self.plan.epoch(last) + 1) if last >= 0 else 0,
            "total_time_seconds": self._elapsed,
            "samples_per_second": self._samples / self._elapsed if self._elapsed > 0 else 0.0,
            "best_metric": best,
            "best_step": self.best_step,
            "train_metrics_history": list(self.train_metrics_history),
            "eval_metrics_history": list(self.eval_metrics_history),
            "stopped_early": self.stopped_early,
            "cursor": self.cursor,
            "plan_fingerprint": self.plan.fingerprint,
        }

    # ---- checkpoints ------------------------------------------------------------------------------------------

    def save_state(self, uri: str, *, before_commit: Callable[[], None] | None = None) -> str:
        """A managed checkpoint: the session checkpoint plus cursor, selection state, histories and best weights.

        `before_commit` runs when the files are written, just before the commit (see ``write_checkpoint``)."""
        return self.write_prepared(self._prepare(uri, snapshot=False), before_commit=before_commit)

    def prepare_checkpoint(self, uri: str) -> PreparedCheckpoint:
        """Snapshot the continuation state now (detached host copies of every tensor: one checkpoint's size of
        extra host RAM) for `write_prepared`, which may then run in another thread while training continues."""
        return self._prepare(uri, snapshot=True)

    def write_prepared(self, prepared: PreparedCheckpoint, *, before_commit: Callable[[], None] | None = None) -> str:
        """Write a prepared checkpoint (its best weights stored as a blob first when new); returns the index hash.

        Reads only the snapshot and the best-weights dict it names (never mutated: a new best is a new dict).

        The checkpoint of a finished run is written around the page cache (``direct_io``, local storage): nothing
        reads it back soon, and a run's end should not wait for the cache to find pages for it. Checkpoints taken
        during a run keep the cache, where a resume after a kill finds them."""
        direct = bool(prepared.meta.get("finished"))
        refs = (
            {BEST_WEIGHTS_FILE: self._stored_best(prepared.uri, prepared.best, direct=direct)}
            if prepared.best is not None
            else {}
        )
        return write_checkpoint(
            prepared.uri, prepared.files, prepared.meta, refs=refs, before_commit=before_commit, direct=direct
        )

    def _prepare(self, uri: str, *, snapshot: bool) -> PreparedCheckpoint:
        self._fold_losses()  # mid-window: the queued losses are checked and counted before anything is saved
        files, meta = self.session.state_payload(snapshot=snapshot)
        files[MANAGED_STATE_FILE] = json.dumps(self._managed_state(), sort_keys=True).encode()
        meta.update(
            kind=MANAGED_KIND,
            plan_fingerprint=self.plan.fingerprint,
            cursor=self.cursor,
            validation_due=self.validation_due,
            finished=self.finished,
        )
        return PreparedCheckpoint(uri, files, meta, self.best_state)

    def _stored_best(self, uri: str, best: dict[str, torch.Tensor], *, direct: bool = False) -> FileRef:
        """The blob holding `best`, written once per new best (again only if its blob vanished)."""
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
        stored = self._best_stored
        ref = stored[1] if stored is not None and stored[0] is best else None
        if ref is None or not fs.exists(f"{path.rstrip('/').rsplit('/', 1)[0]}/{ref.path[3:]}"):
            ref = store_blob(uri, lambda handle: write_tensors(handle, best), "safetensors", direct=direct)
            self._best_stored = (best, ref)  # one assignment: a writer thread and a new best never mix the pair
        return ref

    def load_state(self, uri: str) -> dict[str, Any]:
        """Continue a managed run from its checkpoint; needs a fresh session and the same plan."""
        checkpoint = open_checkpoint(uri, read_once=True)  # its bytes end in the tensors: no cached copy kept
        if checkpoint.meta.get("kind") != MANAGED_KIND:
            raise PlanMismatchError(f"{uri} is a plain session checkpoint; use TrainingSession.load_state for it")
        state = json.loads(checkpoint.require(MANAGED_STATE_FILE))
        saved = state["plan_fingerprint"]
        if saved != self.plan.fingerprint:
            raise PlanMismatchError(
                f"checkpoint plan {saved[:12]} != requested plan {self.plan.fingerprint[:12]}: the micro-batch plan "
                "changed (data, config or architecture). Resume with the original manifest, or start a new run "
                "(new run key / output) with load_weights to warm-start from this checkpoint"
            )
        if state["eval_hash"] != self._eval_hash:
            raise PlanMismatchError("the validation examples differ from the checkpoint's run; pass the original ones")
        if not self.session.is_fresh:
            raise SessionStateError("ManagedTraining.load_state needs a fresh session")
        best: dict[str, torch.Tensor] | None = None
        if checkpoint.has(BEST_WEIGHTS_FILE):  # read (and verified) before the session changes
            best = tensor_file(checkpoint, BEST_WEIGHTS_FILE)
        self.session.restore_payload(checkpoint)
        self._load_managed_state(state)
        self.best_state = best
        ref = checkpoint.refs.get(BEST_WEIGHTS_FILE)
        self._best_stored = (best, ref) if best is not None and ref is not None else None
        return checkpoint.meta

    def _managed_state(self) -> dict[str, Any]:
        return {
            "plan_fingerprint": self.plan.fingerprint,
            "eval_hash": self._eval_hash,
            "cursor": self.cursor,
            "validation_due": self.validation_due,
            "stopped_early": self.stopped_early,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "patience_counter": self.patience_counter,
            "window_loss": self._window_loss,
            "train_metrics_history": self.train_metrics_history,
            "eval_metrics_history": self.eval_metrics_history,
            "elapsed": self._elapsed,
            "samples": self._samples,
        }

    def _load_managed_state(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.validation_due = bool(state["validation_due"])
        self.stopped_early = bool(state["stopped_early"])
        self.best_metric = state["best_metric"]
        self.best_step = state["best_step"]
        self.patience_counter = int(state["patience_counter"])
        self._window_loss = float(state["window_loss"])
        self.train_metrics_history = list(state["train_metrics_history"])
        self.eval_metrics_history = list(state["eval_metrics_history"])
        self._elapsed = float(state["elapsed"])
        self._samples = int(state["samples"])

    # ---- export -----------------------------------------------------------------------------------------------

    def export_weights(
        self,
        uri: str,
        *,
        which: str = "best",
        merged: bool = False,
        before_commit: Callable[[], None] | None = None,
        same_bytes: SameBytes | None = None,
    ) -> dict[str, Any]:
        """Export the best model (default, when validation selected one) or the final model, with its fitted
        thresholds and trained schema: ``managed_export.export_managed`` (`same_bytes`: a local file holding the
        weights' bytes, see ``weights.export_weights``)."""
        best = (self.best_state, self.best_step) if self.best_state is not None and self.best_step is not None else None
        return managed_export.export_managed(
            self.session,
            uri,
            best=best,
            fit=self.fit_thresholds,
            schema=self.trained_schema(),
            which=which,
            merged=merged,
            before_commit=before_commit,
            same_bytes=same_bytes,
        )

    def trained_schema(self) -> dict[str, Any]:
        """What the model was trained to extract, as a gliner2 schema dict: ``managed_export.trained_schema``."""
        return managed_export.trained_schema(self.plan)

    def fit_thresholds(
        self, state: dict[str, torch.Tensor] | None = None, step: int | None = None
    ) -> Thresholds | None:
        """Thresholds fitted on the validation records for `state`: ``managed_export.fit_thresholds``."""
        return managed_export.fit_thresholds(self.session, self._eval_batches, state, step)

    def close(self) -> None:
        self.best_state = None
        self.session.close()

    def __enter__(self) -> ManagedTraining:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_selection(self) -> None:
        metric = self.config.metric_for_best
        computed = EVAL_KEYS if self.config.eval_extraction else LOSS_KEYS
        if metric not in computed:
            raise ConfigError(
                f"metric_for_best={metric!r} is not computed by the managed driver; use one of {computed}"
            )
        if self.config.early_stopping and not self._eval_batches:
            raise ConfigError(EARLY_STOPPING_NEEDS_VALIDATION)
