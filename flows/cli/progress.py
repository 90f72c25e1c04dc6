"""What ``train`` and ``demo`` print: a one-line progress bar fed by the run's progress listener, and the run
summary in words."""

from __future__ import annotations

from typing import Any

__all__ = ["ProgressBar", "describe"]


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
            scores = (
                f"F1 {metrics['eval_f1']:.4f} (P {metrics['eval_precision']:.4f}, R {metrics['eval_recall']:.4f}), "
                if "eval_f1" in metrics
                else ""
            )
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


def describe(summary: dict[str, Any]) -> str:
    """A run summary in a few lines: steps, the exported model, the best metric, checkpoints, where things are."""
    best = summary.get("best_metric")
    lines = [
        f"run {summary['run_key']}: {summary.get('total_steps')} steps, {summary.get('total_epochs')} epoch(s)"
        + (", stopped early" if summary.get("stopped_early") else ""),
        f"  model ({summary.get('label')} weights): {summary.get('export')}",
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
