"""What a training run shows while it runs: flow run name and labels, a progress artifact, a validation table,
a markdown summary at the end, and in-process listeners (the CLI's progress bar).

API calls are throttled (at most one round every ``interval`` seconds, plus one at every checkpoint, validation and
at the end) and made from background lanes (flows/prefect_ui.py), so reporting never stalls training. Reporting
never fails a run: an API error is logged and training goes on. What the reports say is in flows/report_text.py.

The state message follows the cursor too: at the start, at every checkpoint and validation and at least every
``message_interval`` seconds, a Running state with the position as its message (``set_running_message``: it does
not count as a new attempt); the final message is the Completed state's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from uuid import UUID

from prefect_gliner2.flows.curves import Curves, curves_markdown
from prefect_gliner2.flows.prefect_compat import flow_run_name, set_running_message
from prefect_gliner2.flows.prefect_ui import (
    ArtifactSlots,
    Job,
    Lane,
    run_logger,
)
from prefect_gliner2.flows.report_text import (
    NAME_LABEL,
    RESUMED_BY_LABEL,
    RESUMES_LABEL,
    position_text,
    summary_markdown,
    validation_rows,
)
from prefect_gliner2.model_registry import mlflow_sync
from prefect_gliner2.runtime.events import validation_event
from prefect_gliner2.runtime.mlflow_model import pyfunc_model
from prefect_gliner2.runtime.protocol import AdvanceResult, CheckpointResult, SummaryResult, ValidateResult

__all__ = ["RunReporter", "add_listener", "mlflow_tracking", "remove_listener"]

logger = logging.getLogger(__name__)
Listener = Callable[[str, dict[str, Any]], None]
#: Seconds an unfinished run's close waits for a labels update in flight (its state message must land before the
#: engine records the run's end).
LABELS_SETTLE = 2.0
MLFLOW_TIMEOUT = 300.0  # seconds a finished run waits for its MLflow logging (the exported model's upload)
_LISTENERS: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Call `listener(kind, data)` on every progress/validation/checkpoint/finish report in this process."""
    _LISTENERS.append(listener)


def remove_listener(listener: Listener) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def mlflow_tracking(run_key: str, plan: Any, model: str, flow_run_id: str | None) -> mlflow_sync.MlflowRun | None:
    """The run's MLflow mirror when MLflow is configured (model_registry/mlflow_sync.py), else None; its
    parameters are the training config and where the run comes from; its export becomes the run's logged model
    (a pyfunc model: runtime/mlflow_model.py)."""
    if not mlflow_sync.enabled():
        return None
    params = {
        **plan.config.to_dict(),
        "model": model,
        "run_key": run_key,
        "plan_fingerprint": plan.fingerprint,
        "batch_count": plan.batch_count,
        "max_steps": plan.max_steps,
    }
    return mlflow_sync.MlflowRun(run_key, plan.fingerprint, params, flow_run_id, pyfunc=pyfunc_model)


class RunReporter:
    """Reports one run's position to Prefect (when inside a flow run) and to in-process listeners.

    Listeners are called at once, in the flow's thread. Prefect API calls run on background lanes (the flow's
    settings, the flow run named explicitly), so a busy server never stalls training: artifacts and the run name in
    order on one lane; labels and the state message on another (a busy SQLite server can take seconds to patch
    labels). ``finish`` waits for both (bounded), so a finished run shows its final position. Each run key has one
    progress, one validation and one summary artifact, updated in place (a resumed run continues the ones its
    crashed run created).
    """

    def __init__(
        self,
        run_key: str,
        plan: Any,
        *,
        flow_run_id: str | None,
        run_dir: str | None = None,
        interval: float = 3.0,
        log_interval: float = 10.0,
        message_interval: float = 60.0,
        curves_interval: float = 30.0,
        tracking: mlflow_sync.MlflowRun | None = None,
    ) -> None:
        self.run_key, self.plan, self.flow_run_id, self.interval = run_key, plan, flow_run_id, interval
        self.run_dir = run_dir
        self.log_interval = log_interval
        self.validations: list[dict[str, Any]] = []
        self.curves = Curves()
        self.tracking, self._finished = tracking, False  # the MLflow mirror, when configured
        self.curves_interval, self._last_curves = curves_interval, 0.0
        self.labels: dict[str, Any] = {}  # extra labels (what this run resumes, the generated name)
        self._artifacts = ArtifactSlots(run_key, flow_run_id) if flow_run_id is not None else None
        self._last_push = self._last_log = self._last_message = 0.0
        self.message_interval = message_interval
        self.state: dict[str, Any] = {"cursor": 0, "step": 0, "epoch": 0, "loss": None, "learning_rate": None}
        self._push_queued = self._labels_queued = self._final = False
        self._closed = False  # set by close(): no Running state is proposed after it (see close)
        # both lanes: short retries of our own (the client's 2-8 s back-off held the final flush; see prefect_ui)
        self._ui = Lane("gliner2-reporter", run_key, own_retries=30.0) if flow_run_id is not None else None
        self._labels = Lane("gliner2-labels", run_key, own_retries=30.0) if flow_run_id is not None else None

    # ---- events from the driver ----------------------------------------------------------------------------

    def introduce(self, resumes: str | None = None) -> None:
        """Label the flow run with its generated name (the run name shows the position instead) and, when it
        continues another flow run's run key, point each run at the other."""
        name, labels = flow_run_name()
        if name is not None:
            self.labels[NAME_LABEL] = labels.get(NAME_LABEL) or name  # a retry of a run this reporter renamed
        if resumes and resumes != self.flow_run_id and self._labels is not None:
            self.labels[RESUMES_LABEL] = resumes
            self._labels.submit(
                lambda client: client.update_flow_run_labels(UUID(resumes), {RESUMED_BY_LABEL: str(self.flow_run_id)})
            )

    def start(self, cursor: int, step: int, restored: SummaryResult | None = None) -> None:
        """The run starts at `cursor`; a resumed run passes the worker's summary of what it `restored` (with the
        training history: it starts the curves; its validations the list)."""
        self.state.update(cursor=cursor, step=step, epoch=self._epoch(cursor))
        history = self._restore(restored) if restored is not None else []
        if self.tracking is not None:
            self.tracking.start(history, self.validations)
        self._emit("start", self._position())
        self._push(force=True)
        self._curves()

    def _restore(self, restored: SummaryResult) -> list[dict[str, Any]]:
        """The training history the restored checkpoint recorded (it starts the curves; its validations the list)."""
        train, evaluations = list(restored.train_metrics_history), list(restored.eval_metrics_history)
        self.curves.add(train)
        self.validations = self.validations or evaluations
        return train

    def progress(self, result: AdvanceResult) -> None:
        self.state.update(cursor=result.cursor, step=result.step, epoch=result.epoch)
        updates = result.updates
        if updates:
            self.state.update(loss=updates[-1].get("loss"), learning_rate=updates[-1].get("learning_rate"))
            self.curves.add(updates)
            if self.tracking is not None:
                self.tracking.steps(updates)
        self._emit("progress", {**self._position(), "loss": updates[-1]["loss"] if updates else None})
        now = time.monotonic()
        if now - self._last_log >= self.log_interval:
            self._last_log = now
            run_logger().info("%s: %s", self.run_key, self.where())
        self._push()
        if now - self._last_curves >= self.curves_interval:
            self._curves()

    def validation(self, result: ValidateResult) -> None:
        self.validations = list(result.history or self.validations)  # the whole history, also on resume
        if self.tracking is not None and result.metrics is not None:
            self.tracking.validation(result.metrics)
        self._emit("validation", asdict(result))
        if self.flow_run_id is not None:
            from prefect.events import emit_event

            epoch = self._epoch(int(result.index or 0)) + 1
            emit_event(**validation_event(self.run_key, self.flow_run_id, self.run_dir, result, epoch))
        rows = validation_rows(self.validations)
        self._submit(lambda client: self._table(client, rows))
        self._push(force=True)
        self._curves()

    def checkpoint(self, info: CheckpointResult) -> None:
        self._emit("checkpoint", asdict(info))
        run_logger().info("%s: checkpoint %s at %s", self.run_key, info.name, self.where())
        self._push(force=True)
        self._curves()

    def finish(self, summary: dict[str, Any], cursor: Any = None, timeout: float = 30.0) -> None:
        """Final reports at the final durable `cursor`; waits (at most `timeout` s) until the Prefect UI shows
        them, labels included."""
        if cursor is not None:
            self.state.update(cursor=cursor.cursor, step=cursor.step)
        self.state.update(epoch=self._epoch(int(self.state["cursor"])))
        self._emit("finish", dict(summary))
        validations = list(self.validations)
        if validations:
            rows = validation_rows(validations)
            self._submit(lambda client: self._table(client, rows))
        self._submit(lambda client: self._markdown(client, summary, validations))
        self._curves()
        if self.tracking is not None:
            self._finished = True
            self.tracking.finish(summary.get("export"), summary)
        self._push(force=True, final=True)
        self.close(timeout, labels_timeout=timeout)

    def close(self, timeout: float = 30.0, *, labels_timeout: float = 0.0) -> None:
        """Finish the queued UI updates (bounded), then the MLflow mirror's (up to `MLFLOW_TIMEOUT` s after a
        finished run: it uploads the model; a run that ends unfinished is marked FAILED there, and its resume
        reopens it).

        No state message is proposed once this starts, and the labels lane gets at least `LABELS_SETTLE` s (within
        `timeout`) to finish the one it may be sending: a run that ends by an exception (an interrupt, a failure) is
        then recorded Crashed or Failed by Prefect's engine, and a Running state with a message proposed after that
        would be accepted (a run may leave Crashed for Running) and leave the run showing RUNNING."""
        self._closed = True
        if self._ui is not None and not self._ui.close(timeout):
            logger.warning("the Prefect UI updates of run %s did not finish within %s s", self.run_key, timeout)
        settle = max(labels_timeout, min(timeout, LABELS_SETTLE))
        if self._labels is not None and not self._labels.close(settle) and labels_timeout:
            logger.warning("the labels of run %s were not updated within %s s", self.run_key, settle)
        self._ui = self._labels = None
        tracking, self.tracking = self.tracking, None
        # an unfinished run (a failure, an interrupt) waits briefly: its resume logs what is missing
        wait = MLFLOW_TIMEOUT if self._finished else min(timeout, 2.0)
        if tracking is not None and not tracking.close(wait, failed=not self._finished):
            logger.warning("the MLflow logging of run %s did not finish within %s s", self.run_key, wait)

    # ---- helpers -------------------------------------------------------------------------------------------

    def where(self, state: dict[str, Any] | None = None) -> str:
        """The position in words: 1-based epoch, batches and optimizer steps done, latest loss and rate."""
        return position_text(state or self.state, self.plan)

    def _epoch(self, cursor: int) -> int:
        return self.plan.epoch(min(cursor, self.plan.batch_count - 1)) if self.plan.batch_count else 0

    def _position(self) -> dict[str, Any]:
        return {
            **self.state,
            "batch_count": self.plan.batch_count,
            "max_steps": self.plan.max_steps,
            "num_epochs": self.plan.num_epochs,
        }

    def _emit(self, kind: str, data: dict[str, Any]) -> None:
        for listener in list(_LISTENERS):
            try:
                listener(kind, data)
            except Exception:  # noqa: BLE001 - a broken listener must not stop training
                logger.exception("progress listener %r failed", listener)

    def _push(self, *, force: bool = False, final: bool = False) -> None:
        """Queue a name/progress update (and on `force` a labels update) unless one is queued already: a
        queued update sends the state current when it runs."""
        now = time.monotonic()
        if self._ui is None or (not force and now - self._last_push < self.interval):
            return
        self._last_push = now
        self._final = self._final or final
        if not self._push_queued:
            self._push_queued = True
            self._submit(self._push_now)
        # labels and the state message: at every checkpoint, validation and the end, and at least every
        # message_interval seconds while training
        due = force or now - self._last_message >= self.message_interval
        if due and self._labels is not None and not self._labels_queued:
            self._labels_queued = True
            self._last_message = now
            self._labels.submit(self._labels_now)

    def _curves(self) -> None:
        """Queue an update of the curves artifact with the points recorded so far (drawn in the lane)."""
        if self._ui is None:
            return
        self._last_curves = time.monotonic()
        points, validations, max_steps = self.curves.points(), list(self.validations), self.plan.max_steps
        self._submit(
            lambda client: self._upsert(
                client,
                "curves",
                curves_markdown(self.run_key, points, validations, max_steps),
                f"training curves of {self.run_key}: loss, learning rate, validation F1",
            )
        )

    def _submit(self, job: Job) -> None:
        if self._ui is not None:
            self._ui.submit(job)

    def _push_now(self, client: Any) -> None:
        self._push_queued = False
        s, final = dict(self.state), self._final
        percent = 100.0 if final else round(100.0 * s["cursor"] / max(self.plan.batch_count, 1), 1)
        where = self.where(s)
        self._upsert(client, "progress", percent, f"{self.run_key}: {where}")
        client.update_flow_run(
            UUID(str(self.flow_run_id)), name=f"{self.run_key} · {where}" + (" · done" if final else "")
        )

    def _labels_now(self, client: Any) -> None:
        """Labels and the state message at the current position; a mid-run update stops as soon as the final one
        is queued (it writes newer values)."""
        self._labels_queued = False
        s, final = dict(self.state), self._final
        flow_run_id = UUID(str(self.flow_run_id))
        labels = {
            **self.labels,
            "prefect-gliner2.run-key": self.run_key,
            "prefect-gliner2.epoch": s["epoch"] + 1,
            "prefect-gliner2.batch": s["cursor"],
            "prefect-gliner2.step": s["step"],
        }
        client.update_flow_run_labels(flow_run_id, labels)
        if not final and not self._final and not self._closed:  # the final message is the Completed state's
            set_running_message(client, flow_run_id, f"{self.run_key}: {self.where(s)}")

    def _upsert(self, client: Any, what: str, data: Any, description: str) -> None:
        if self._artifacts is not None:
            self._artifacts.upsert(client, what, data, description)

    def _table(self, client: Any, rows: list[dict[str, Any]]) -> None:
        self._upsert(client, "validation", rows, f"validation history of {self.run_key} (epochs from 1)")

    def _markdown(self, client: Any, summary: dict[str, Any], validations: list[dict[str, Any]]) -> None:
        named = {**summary, "flow_run_name": self.labels.get(NAME_LABEL)}
        text = summary_markdown(self.run_key, named, validations)
        self._upsert(client, "summary", text, f"summary of {self.run_key}")
