"""What ``train``, ``demo`` and ``extract`` print: one-line progress bars (training batches fed by the run's progress
listener; records extracted), and the run summary in words."""

from __future__ import annotations

from typing import Any

from prefect_gliner2.session_core.score_text import validation_scores
from prefect_gliner2.session_core.thresholds import describe as describe_thresholds

__all__ = ["ProgressBar", "RecordBar", "describe"]


class ProgressBar:
    """A one-line terminal progress bar fed by the run's progress listener (redrawn in place on a TTY)."""

    WIDTH = 28

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = ""
        self.loss: float | None = None

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind in ("start", "progress") and "batch_count" in data:
            self.loss = data.get("loss", self.loss)
            self._draw(data, final=False)
        elif kind == "validation" and data.get("metrics"):
            metrics = data["metrics"]
            scores = f"{validation_scores(metrics)}; " if "eval_f1" in metrics else ""
            self._line(f"validation at step {metrics.get('step')}: {scores}eval_loss {metrics.get('eval_loss'):.6g}")
        elif kind == "checkpoint" and data.get("committed"):
            self._line(f"checkpoint {data.get('name')} committed")

    def _draw(self, data: dict[str, Any], *, final: bool) -> None:
        total = max(int(data["batch_count"]), 1)
        done = min(int(data["cursor"]), total)
        filled = self.WIDTH * done // total
        loss = f" · loss {self.loss:.4g}" if isinstance(self.loss, float) else ""
        text = (
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] batch {done}/{total} · step {data['step']}/"
            f"{data['max_steps']} · epoch {data['epoch'] + 1}/{data['num_epochs']}{loss}"
        )
        self.last = text
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()

    def _line(self, text: str) -> None:
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        if not self.tty and self.last:
            self.stream.write(self.last + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


class RecordBar:
    """A one-line bar of records done out of a total, with the rate, redrawn in place on a TTY; elsewhere a line
    per `every` seconds (and the last), so a log shows progress without a line per chunk."""

    WIDTH = 28

    def __init__(self, stream: Any, total: int, what: str = "records", every: float = 10.0) -> None:
        import time

        self.stream = stream
        self.total = max(total, 1)
        self.what = what
        self.every = every
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.clock = time.monotonic
        self.started = self.clock()
        self.printed = 0.0
        self.last = ""
        self.reused = 0  # records done by an earlier run (not counted in the rate)

    def update(self, done: int, note: str = "") -> None:
        now = self.clock()
        elapsed = max(now - self.started, 1e-9)
        filled = self.WIDTH * min(done, self.total) // self.total
        text = (
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} {self.what} · "
            f"{(done - self.reused) / elapsed:.1f}/s{' · ' + note if note else ''}"
        )
        self.last = text
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
        elif done >= self.total or now - self.printed >= self.every:
            self.printed = now
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


def describe(summary: dict[str, Any]) -> str:
    """A run summary in a few lines: steps, the exported model, the best metric, checkpoints, where things are."""
    best = summary.get("best_metric")
    lines = [
        f"run {summary['run_key']}: {summary.get('total_steps')} steps, {summary.get('total_epochs')} epoch(s)"
        + (", stopped early" if summary.get("stopped_early") else ""),
        f"  model ({summary.get('label')} weights of step {summary.get('export_step')}): {summary.get('export')}",
        f"  {describe_thresholds(summary.get('thresholds'))}",
        f"  best {summary.get('metric_for_best')}: "
        + (f"{best:.4f} at step {summary.get('best_step')}" if best is not None else "n/a (no validation data)"),
        f"  checkpoints: {summary.get('checkpoints')} (newest {summary.get('checkpoint')})",
        f"  run directory: {summary.get('run_dir')}",
    ]
    if summary.get("flow_run_id"):
        lines.append(
            f"  Prefect flow run: {summary['flow_run_id']} (prefect flow-run inspect {summary['flow_run_id']})"
        )
    lines += [f"WARNING: {warning}" for warning in summary.get("warnings") or ()]
    return "\n".join(lines)
