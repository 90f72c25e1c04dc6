"""What a training run shows while it runs: flow run name and labels, a progress artifact, a validation table,
a markdown summary at the end, and in-process listeners (the CLI's progress bar).

API calls are throttled (at most one round every ``interval`` seconds, plus one at every checkpoint, validation and
at the end) and made from a background thread, so reporting never stalls training. Reporting never fails a run:
an API error is logged and training goes on.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect_gliner2.session_core.metrics import EXTRACTION_KEYS, LOSS_KEYS

__all__ = [
    "RunReporter",
    "add_listener",
    "artifact_key",
    "remove_listener",
    "summary_markdown",
    "validation_rows",
]

logger = logging.getLogger(__name__)
Listener = Callable[[str, dict[str, Any]], None]
_LISTENERS: list[Listener] = []
DIGITS = 4  # metrics in tables and logs are rounded to this many decimals


def add_listener(listener: Listener) -> None:
    """Call `listener(kind, data)` on every progress/validation/checkpoint/finish report in this process."""
    _LISTENERS.append(listener)


def remove_listener(listener: Listener) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def artifact_key(run_key: str, what: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_key.lower()).strip("-") or "run"
    return f"gliner2-{slug}-{what}"


class _Lane:
    """One background thread running jobs in order, inside a copy of the creating thread's context."""

    def __init__(self, name: str, run_key: str) -> None:
        self.run_key = run_key
        self.abandoned = False
        self.jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        context = contextvars.copy_context()
        self.thread: threading.Thread | None = threading.Thread(
            target=context.run, args=(self._serve,), name=name, daemon=True
        )
        self.thread.start()

    def submit(self, job: Callable[[], Any]) -> None:
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
        from prefect.context import AsyncClientContext, SyncClientContext

        # Our own API client: the flow's client (in the copied context) is closed when the flow ends, and this
        # thread may still be finishing its last jobs then.
        SyncClientContext.__var__.set(None)  # type: ignore[arg-type]
        AsyncClientContext.__var__.set(None)  # type: ignore[arg-type]
        with SyncClientContext.get_or_create():
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                try:
                    job()
                except Exception as exc:  # noqa: BLE001 - reporting must never fail a training run
                    # after the run ended (an abandoned best-effort lane), the server may be gone: not worth a warning
                    log = logger.debug if self.abandoned else logger.warning
                    log("could not update the Prefect UI for run %s: %s", self.run_key, exc)


class RunReporter:
    """Reports one run's position to Prefect (when inside a flow run) and to in-process listeners.

    Listeners are called at once, in the flow's thread. Prefect API calls run on background threads (with the flow
    run's context), so a busy server never stalls training: artifacts and the run name in order on one lane,
    which ``finish`` waits for (bounded); labels, best effort, on another (a busy SQLite server can take seconds to
    patch labels), awaited only briefly.
    """

    def __init__(self, run_key: str, plan: Any, *, flow_run_id: str | None, interval: float = 3.0) -> None:
        self.run_key, self.plan, self.flow_run_id, self.interval = run_key, plan, flow_run_id, interval
        self.validations: list[dict[str, Any]] = []
        self._artifact_id: Any = None
        self._last_push = 0.0
        self.state: dict[str, Any] = {"cursor": 0, "step": 0, "epoch": 0}
        self._push_queued = self._labels_queued = self._final = False
        self._ui = _Lane("gliner2-reporter", run_key) if flow_run_id is not None else None
        self._labels = _Lane("gliner2-labels", run_key) if flow_run_id is not None else None

    # ---- events from the driver ----------------------------------------------------------------------------

    def start(self, cursor: int, step: int) -> None:
        self.state.update(cursor=cursor, step=step, epoch=self._epoch(cursor))
        self._submit(self._create_progress)
        self._emit("start", self._position())
        self._push(force=True)

    def progress(self, result: dict[str, Any]) -> None:
        self.state.update(cursor=result["cursor"], step=result["step"], epoch=result["epoch"])
        updates = result.get("updates") or []
        self._emit("progress", {**self._position(), "loss": updates[-1]["loss"] if updates else None})
        self._push()

    def validation(self, result: dict[str, Any]) -> None:
        self.validations = list(result.get("history") or self.validations)  # the whole history, also on resume
        self._emit("validation", dict(result))
        rows = validation_rows(self.validations)
        self._submit(lambda: self._table(rows))
        self._push(force=True)

    def checkpoint(self, info: dict[str, Any]) -> None:
        self._emit("checkpoint", dict(info))
        self._push(force=True)

    def finish(self, summary: dict[str, Any], timeout: float = 30.0) -> None:
        """Final reports; waits (at most `timeout` s) until the Prefect UI shows them."""
        self.state.update(cursor=self.plan.batch_count)
        self._emit("finish", dict(summary))
        validations = list(self.validations)
        self._submit(lambda: self._markdown(summary, validations))
        self._push(force=True, final=True)
        self.close(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._ui is not None and not self._ui.close(timeout):
            logger.warning("the Prefect UI updates of run %s did not finish within %s s", self.run_key, timeout)
        if self._labels is not None:
            self._labels.close(0)  # best effort: the thread finishes on its own while the process lives on
        self._ui = self._labels = None

    # ---- helpers -------------------------------------------------------------------------------------------

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
        """Queue a name/progress update (and on `force` a labels update) unless one is queued already: a queued
        update sends the state current when it runs."""
        now = time.monotonic()
        if self._ui is None or (not force and now - self._last_push < self.interval):
            return
        self._last_push = now
        self._final = self._final or final
        if not self._push_queued:
            self._push_queued = True
            self._submit(self._push_now)
        if force and self._labels is not None and not self._labels_queued:
            self._labels_queued = True
            self._labels.submit(self._labels_now)

    def _submit(self, job: Callable[[], Any]) -> None:
        if self._ui is not None:
            self._ui.submit(job)

    def _push_now(self) -> None:
        from prefect.artifacts import update_progress_artifact
        from prefect.client.orchestration import get_client

        self._push_queued = False
        s, p, final = dict(self.state), self.plan, self._final
        percent = 100.0 if final else round(100.0 * s["cursor"] / max(p.batch_count, 1), 2)
        where = (
            f"epoch {s['epoch'] + 1}/{p.num_epochs} · batch {s['cursor']}/{p.batch_count} · "
            f"step {s['step']}/{p.max_steps}"
        )
        if self._artifact_id is not None:
            update_progress_artifact(self._artifact_id, percent, description=f"{self.run_key}: {where}")
        with get_client(sync_client=True) as client:
            client.update_flow_run(
                UUID(str(self.flow_run_id)), name=f"{self.run_key} · {where}" + (" · done" if final else "")
            )

    def _labels_now(self) -> None:
        from prefect.client.orchestration import get_client

        self._labels_queued = False
        s = dict(self.state)
        with get_client(sync_client=True) as client:
            client.update_flow_run_labels(
                UUID(str(self.flow_run_id)),
                {
                    "prefect-gliner2.run-key": self.run_key,
                    "prefect-gliner2.epoch": s["epoch"] + 1,
                    "prefect-gliner2.batch": s["cursor"],
                    "prefect-gliner2.step": s["step"],
                },
            )

    def _create_progress(self) -> None:
        from prefect.artifacts import create_progress_artifact

        percent = round(100.0 * self.state["cursor"] / max(self.plan.batch_count, 1), 2)
        self._artifact_id = create_progress_artifact(
            percent, key=artifact_key(self.run_key, "progress"), description=f"training progress of {self.run_key}"
        )

    def _table(self, rows: list[dict[str, Any]]) -> None:
        from prefect.artifacts import create_table_artifact

        create_table_artifact(
            rows, key=artifact_key(self.run_key, "validation"), description=f"validation history of {self.run_key}"
        )

    def _markdown(self, summary: dict[str, Any], validations: list[dict[str, Any]]) -> None:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(
            summary_markdown(self.run_key, summary, validations),
            key=artifact_key(self.run_key, "summary"),
            description=f"summary of {self.run_key}",
        )


def _rounded(value: Any) -> Any:
    return round(float(value), DIGITS) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _prf(row: dict[str, Any]) -> str:
    return " / ".join(f"{float(row[k]):.{DIGITS - 1}f}" for k in ("precision", "recall", "f1"))


def validation_rows(validations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation table: position (1-based epoch, as in the run name), overall P/R/F1 and the per-kind and macro
    F1s that were measured, "P / R / F1" per label, then the native losses; rounded."""
    rows = []
    for entry in validations:
        row: dict[str, Any] = {"step": entry.get("step"), "epoch": int(entry.get("epoch", 0)) + 1}
        row["batch"] = entry.get("batch")
        row.update({key: _rounded(entry[key]) for key in EXTRACTION_KEYS if key in entry})
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
