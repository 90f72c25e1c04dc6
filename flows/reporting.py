"""What a training run shows while it runs: flow run name and labels, a progress artifact, a validation table,
a markdown summary at the end, and in-process listeners (the CLI's progress bar).

API calls are throttled (at most one round every ``interval`` seconds, plus one at every checkpoint, validation and
at the end) and made from a background thread, so reporting never stalls training. Reporting never fails a run:
an API error is logged and training goes on.

The background threads use their own API client (the flow's closes when the flow ends, and a thread may still be
finishing its last jobs then) and name the flow run explicitly; they start from an empty context plus a copy of the
flow's Prefect settings (which API to talk to), so no Prefect context variable is reset or overwritten.

The state message follows the cursor too: at the start, at every checkpoint and validation and at least every
``message_interval`` seconds, a Running state with the position as its message (see ``_set_running_message``:
it does not count as a new attempt); the final message is the Completed state's.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from uuid import UUID

from prefect_gliner2.runtime.protocol import AdvanceResult, CheckpointResult, ValidateResult
from prefect_gliner2.session_core.metrics import EXTRACTION_KEYS, KIND_F1_KEYS, LOSS_KEYS

__all__ = [
    "RunReporter",
    "add_listener",
    "artifact_key",
    "remove_listener",
    "rounded",
    "summary_markdown",
    "validation_rows",
]

logger = logging.getLogger(__name__)
NAME_LABEL = "prefect-gliner2.flow-run-name"  # the name Prefect generated (the run name shows the position)
RESUMES_LABEL = "prefect-gliner2.resumes"  # the flow run that held this run key before
RESUMED_BY_LABEL = "prefect-gliner2.resumed-by"  # on that earlier run: the flow run that continued it
Listener = Callable[[str, dict[str, Any]], None]
Job = Callable[[Any], Any]  # called with the lane's SyncPrefectClient
_LISTENERS: list[Listener] = []
DIGITS = 4  # P/R/F1 cells show DIGITS - 1 decimals; other numbers DIGITS + 2 significant digits


def add_listener(listener: Listener) -> None:
    """Call `listener(kind, data)` on every progress/validation/checkpoint/finish report in this process."""
    _LISTENERS.append(listener)


def remove_listener(listener: Listener) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def artifact_key(scope: str, what: str) -> str:
    """The one artifact key pattern: ``gliner2-<scope>-<what>``, scope a run key (training runs),
    ``model-<name>`` (retraining) or ``sweep-<sweep key>`` (sweeps), lowercased with every run of other characters
    made one dash (keys allow lowercase letters, digits and dashes only)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", scope.lower()).strip("-") or "run"
    return f"gliner2-{slug}-{what}"


def rounded(value: Any, digits: int = 6) -> Any:
    """Floats to `digits` significant digits (for what people read); everything else as it is."""
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return float(f"{value:.{digits}g}")
    return value


class _Lane:
    """One background thread running jobs in order with its own API client, under the creating thread's Prefect
    settings (and no other context)."""

    def __init__(self, name: str, run_key: str) -> None:
        from prefect.context import get_settings_context

        self.run_key = run_key
        self.abandoned = False
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.settings = get_settings_context().model_copy()  # entered in the thread's own, empty context
        self.thread: threading.Thread | None = threading.Thread(
            target=contextvars.Context().run, args=(self._serve,), name=name, daemon=True
        )
        self.thread.start()

    def submit(self, job: Job) -> None:
        if self.thread is not None:
            self.jobs.put(job)

    def close(self, timeout: float) -> bool:
        """Finish queued jobs (waiting at most `timeout` s); True when they all ran."""
        if self.thread is None:
            return True
        self.jobs.put(None)
        self.thread.join(timeout)
        done = not self.thread.is_alive()
        self.thread = None
        self.abandoned = not done  # its remaining jobs may outlive the flow run (and its API server)
        return done

    def _serve(self) -> None:
        from prefect.client.orchestration import get_client

        with self.settings, get_client(sync_client=True) as client:
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                try:
                    job(client)
                except Exception as exc:  # noqa: BLE001 - reporting must never fail a training run
                    # after the run ended (an abandoned best-effort lane), the server may be gone: not worth a warning
                    log = logger.debug if self.abandoned else logger.warning
                    log("could not update the Prefect UI for run %s: %s", self.run_key, exc)


class RunReporter:
    """Reports one run's position to Prefect (when inside a flow run) and to in-process listeners.

    Listeners are called at once, in the flow's thread. Prefect API calls run on background threads (with the flow
    run's context), so a busy server never stalls training: artifacts and the run name in order on one lane;
    labels on another (a busy SQLite server can take seconds to patch labels). ``finish`` waits for both
    (bounded), so a finished run shows its final position. Each run key has one progress, one validation and one
    summary artifact, updated in place (a resumed run continues the ones its crashed run created).
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
    ) -> None:
        self.run_key, self.plan, self.flow_run_id, self.interval = run_key, plan, flow_run_id, interval
        self.run_dir = run_dir
        self.log_interval = log_interval
        self.validations: list[dict[str, Any]] = []
        self.labels: dict[str, Any] = {}  # extra labels (what this run resumes, the generated name)
        self._artifacts: dict[str, Any] = {}
        self._last_push = self._last_log = self._last_message = 0.0
        self.message_interval = message_interval
        self.state: dict[str, Any] = {"cursor": 0, "step": 0, "epoch": 0, "loss": None, "learning_rate": None}
        self._push_queued = self._labels_queued = self._final = False
        self._ui = _Lane("gliner2-reporter", run_key) if flow_run_id is not None else None
        self._labels = _Lane("gliner2-labels", run_key) if flow_run_id is not None else None

    # ---- events from the driver ----------------------------------------------------------------------------

    def introduce(self, resumes: str | None = None) -> None:
        """Label the flow run with its generated name (the run name shows the position instead) and, when it
        continues another flow run's run key, point each run at the other."""
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        flow_run = context.flow_run if context is not None else None
        if flow_run is not None:
            earlier = (flow_run.labels or {}).get(NAME_LABEL)  # a retry of a run this reporter renamed
            self.labels[NAME_LABEL] = earlier or flow_run.name
        if resumes and resumes != self.flow_run_id and self._labels is not None:
            self.labels[RESUMES_LABEL] = resumes
            self._labels.submit(
                lambda client: client.update_flow_run_labels(UUID(resumes), {RESUMED_BY_LABEL: str(self.flow_run_id)})
            )

    def start(self, cursor: int, step: int) -> None:
        self.state.update(cursor=cursor, step=step, epoch=self._epoch(cursor))
        self._emit("start", self._position())
        self._push(force=True)

    def progress(self, result: AdvanceResult) -> None:
        self.state.update(cursor=result.cursor, step=result.step, epoch=result.epoch)
        updates = result.updates
        if updates:
            self.state.update(loss=updates[-1].get("loss"), learning_rate=updates[-1].get("learning_rate"))
        self._emit("progress", {**self._position(), "loss": updates[-1]["loss"] if updates else None})
        now = time.monotonic()
        if now - self._last_log >= self.log_interval:
            self._last_log = now
            _run_logger().info("%s: %s", self.run_key, self.where())
        self._push()

    def validation(self, result: ValidateResult) -> None:
        self.validations = list(result.history or self.validations)  # the whole history, also on resume
        self._emit("validation", asdict(result))
        metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
        if self.flow_run_id is not None:
            from prefect_gliner2.flows.events import VALIDATION_COMPLETED, emit_run_event

            payload: dict[str, Any] = {"run_dir": self.run_dir, "metrics": metrics, "step": result.step}
            payload |= {"batch": result.index, "epoch": self._epoch(int(result.index or 0)) + 1}
            payload |= {"best_metric": result.best_metric, "best_step": result.best_step}
            emit_run_event(VALIDATION_COMPLETED, self.run_key, self.flow_run_id, payload)
        rows = validation_rows(self.validations)
        self._submit(lambda client: self._table(client, rows))
        self._push(force=True)

    def checkpoint(self, info: CheckpointResult) -> None:
        self._emit("checkpoint", asdict(info))
        _run_logger().info("%s: checkpoint %s at %s", self.run_key, info.name, self.where())
        self._push(force=True)

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
        self._push(force=True, final=True)
        self.close(timeout, labels_timeout=timeout)

    def close(self, timeout: float = 30.0, *, labels_timeout: float = 0.0) -> None:
        if self._ui is not None and not self._ui.close(timeout):
            logger.warning("the Prefect UI updates of run %s did not finish within %s s", self.run_key, timeout)
        if self._labels is not None and not self._labels.close(labels_timeout) and labels_timeout:
            logger.warning("the labels of run %s were not updated within %s s", self.run_key, labels_timeout)
        self._ui = self._labels = None

    # ---- helpers -------------------------------------------------------------------------------------------

    def where(self, state: dict[str, Any] | None = None) -> str:
        """The position in words: 1-based epoch, batches and optimizer steps done, latest loss and rate."""
        s, p = state or self.state, self.plan
        text = f"epoch {s['epoch'] + 1}/{p.num_epochs} · batch {s['cursor']}/{p.batch_count}"
        text += f" · step {s['step']}/{p.max_steps}"
        if s.get("loss") is not None:
            text += f" · loss {rounded(float(s['loss']), 4):g}"
        if s.get("learning_rate") is not None:
            text += f" · lr {rounded(float(s['learning_rate']), 3):g}"
        return text

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
        self._labels_queued = False
        s = dict(self.state)
        client.update_flow_run_labels(
            UUID(str(self.flow_run_id)),
            {
                **self.labels,
                "prefect-gliner2.run-key": self.run_key,
                "prefect-gliner2.epoch": s["epoch"] + 1,
                "prefect-gliner2.batch": s["cursor"],
                "prefect-gliner2.step": s["step"],
            },
        )
        if not self._final:  # the final message is the Completed state's
            _set_running_message(client, UUID(str(self.flow_run_id)), f"{self.run_key}: {self.where(s)}")

    def _upsert(self, client: Any, what: str, data: Any, description: str) -> None:
        """Update this run key's artifact `what` in place; create it (for this flow run, named explicitly: the
        lane has no run context) when the run key has none yet."""
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        key = artifact_key(self.run_key, what)
        if what not in self._artifacts:
            self._artifacts[what] = _latest_artifact_id(client, key)
        artifact_id = self._artifacts[what]
        stored = json.dumps(_finite_or_none(data)) if what == "validation" else data
        if artifact_id is not None:
            client.update_artifact(artifact_id, ArtifactUpdate(data=stored, description=description))
            return
        kind = {"progress": "progress", "validation": "table"}.get(what, "markdown")
        request = ArtifactCreate(
            type=kind, key=key, description=description, data=stored, flow_run_id=UUID(str(self.flow_run_id))
        )
        self._artifacts[what] = client.create_artifact(artifact=request).id

    def _table(self, client: Any, rows: list[dict[str, Any]]) -> None:
        self._upsert(client, "validation", rows, f"validation history of {self.run_key} (epochs from 1)")

    def _markdown(self, client: Any, summary: dict[str, Any], validations: list[dict[str, Any]]) -> None:
        named = {**summary, "flow_run_name": self.labels.get(NAME_LABEL)}
        text = summary_markdown(self.run_key, named, validations)
        self._upsert(client, "summary", text, f"summary of {self.run_key}")


def _set_running_message(client: Any, flow_run_id: UUID, message: str) -> None:
    """Show `message` as the running flow run's state message, without counting a new attempt.

    A state message can only change with a new state, and every Running state the server accepts increments the
    run's ``run_count`` (which would use up the flow's retries) unless the run's policy is marked ``resuming``
    (Prefect's mechanism for continuing a paused run: the server then clears the mark in the same transition).
    So: only while the run is Running, mark it resuming and propose Running with the message; when the server
    refuses, take the mark back. The read-then-propose window is milliseconds; a cancellation landing in it is
    still acted on (the runner reacts to the Cancelling event itself)."""
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Running

    flow_run = client.read_flow_run(flow_run_id)
    state = flow_run.state
    if state is None or state.type != StateType.RUNNING or state.message == message:
        return
    policy = flow_run.empirical_policy
    client.update_flow_run(flow_run_id, empirical_policy=policy.model_copy(update={"resuming": True}))
    result = client.set_flow_run_state(flow_run_id, Running(message=message))
    if result.status != SetStateStatus.ACCEPT:
        client.update_flow_run(flow_run_id, empirical_policy=policy.model_copy(update={"resuming": False}))


def _finite_or_none(value: Any) -> Any:
    """JSON-safe table cells: NaN and infinities become None (as Prefect's table artifacts do)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(item) for item in value]
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    return value


def _latest_artifact_id(client: Any, key: str) -> Any:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
    )
    return found[0].id if found else None


def _run_logger() -> Any:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logger


def _rounded(value: Any) -> Any:
    """Numbers to DIGITS + 2 significant digits (what people read in tables and summaries)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return rounded(float(value), DIGITS + 2)
    return value


def _prf(row: dict[str, Any]) -> str:
    return " / ".join(f"{float(row[k]):.{DIGITS - 1}f}" for k in ("precision", "recall", "f1"))


def validation_rows(validations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation table: position (1-based epoch, as in the run name), overall P/R/F1 and the per-kind and macro
    F1s that were measured (a task kind with no label in the validation schema has no column: its F1 would read 0),
    "P / R / F1" per label, then the native losses; rounded."""
    rows = []
    for entry in validations:
        row: dict[str, Any] = {"step": entry.get("step"), "epoch": int(entry.get("epoch", 0)) + 1}
        row["batch"] = entry.get("batch")
        labels = entry.get("per_label")
        absent = {key for kind, key in KIND_F1_KEYS.items() if labels and all(r["kind"] != kind for r in labels)}
        row.update({key: _rounded(entry[key]) for key in EXTRACTION_KEYS if key in entry and key not in absent})
        for label in entry.get("per_label") or []:
            name = label["label"] if label["kind"] == "entities" else f"{label['kind']}/{label['label']}"
            row[f"{name} P / R / F1"] = _prf(label)
        row.update({key: _rounded(entry.get(key)) for key in LOSS_KEYS})
        rows.append(row)
    return rows


def summary_markdown(run_key: str, summary: dict[str, Any], validations: list[dict[str, Any]]) -> str:
    metric = summary.get("metric_for_best", "eval_f1")
    best = summary.get("best_metric")
    best_step = summary.get("best_step")
    lines = [
        f"# GLiNER2 training run `{run_key}`",
        "",
        f"- **model exported**: `{summary.get('export')}` ({summary.get('label')} weights)",
        f"- **steps**: {summary.get('total_steps')} over {summary.get('total_epochs')} epoch(s)"
        + (" — stopped early" if summary.get("stopped_early") else ""),
        f"- **best {metric}**: {_rounded(best) if best is not None else 'n/a (no validation)'}"
        + (f" at step {best_step}" if best_step is not None else ""),
    ]
    chosen = next((v for v in validations if v.get("step") == best_step), None)
    if chosen is not None and "eval_f1" in chosen:
        lines.append(
            f"- **best F1**: {_rounded(chosen['eval_f1'])} at step {best_step} (precision "
            f"{_rounded(chosen['eval_precision'])}, recall {_rounded(chosen['eval_recall'])})"
        )
    lines += [
        f"- **checkpoints**: `{summary.get('checkpoints')}` (newest `{summary.get('checkpoint')}`)",
        f"- **run directory**: `{summary.get('run_dir')}`",
    ]
    if summary.get("flow_run_name"):
        lines.append(f"- **flow run**: {summary['flow_run_name']} (`{summary.get('flow_run_id')}`)")
    if summary.get("disk_bytes") is not None:
        lines.append(
            f"- **disk used**: {summary['disk_bytes'] / 2**20:.1f} MiB, of which checkpoints "
            f"{summary.get('checkpoint_bytes', 0) / 2**20:.1f} MiB ({summary.get('checkpoints_kept')} kept)"
        )
    if validations:
        extraction = "eval_f1" in validations[0]
        head = "| step | epoch | " + ("precision | recall | F1 | " if extraction else "") + "eval_loss |"
        lines += ["", head, "|---:|---:|" + ("---:|---:|---:|" if extraction else "") + "---:|"]
        for v in validations:
            scores = " | ".join(str(_rounded(v[k])) for k in ("eval_precision", "eval_recall", "eval_f1"))
            lines.append(
                f"| {v.get('step')} | {int(v.get('epoch', 0)) + 1} | "
                + (f"{scores} | " if extraction else "")
                + f"{v.get('eval_loss'):.6g} |"
            )
    if chosen is not None and chosen.get("per_label"):
        lines += ["", f"Per label at step {best_step}:", "", "| kind | label | precision | recall | F1 | support |"]
        lines.append("|---|---|---:|---:|---:|---:|")
        for row in chosen["per_label"]:
            lines.append(
                f"| {row['kind']} | {row['label']} | {_rounded(row['precision'])} | {_rounded(row['recall'])} | "
                f"{_rounded(row['f1'])} | {row['support']} |"
            )
    return "\n".join(lines) + "\n"
