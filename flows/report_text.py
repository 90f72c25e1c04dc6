"""What run reports say: label names, artifact keys, the position in words, the validation table and the summary
markdown (plain data and text; flows/prefect_ui.py sends them)."""

from __future__ import annotations

import math
import re
from typing import Any

from prefect_gliner2.session_core.metrics import EXTRACTION_KEYS, KIND_F1_KEYS, LOSS_KEYS
from prefect_gliner2.session_core.thresholds import describe as describe_thresholds

__all__ = [
    "NAME_LABEL",
    "RESUMED_BY_LABEL",
    "RESUMES_LABEL",
    "artifact_key",
    "finite_or_none",
    "position_text",
    "rounded",
    "summary_markdown",
    "validation_rows",
]

NAME_LABEL = "prefect-gliner2.flow-run-name"  # the name Prefect generated (the run name shows the position)
RESUMES_LABEL = "prefect-gliner2.resumes"  # the flow run that held this run key before
RESUMED_BY_LABEL = "prefect-gliner2.resumed-by"  # on that earlier run: the flow run that continued it
DIGITS = 4  # P/R/F1 cells show DIGITS - 1 decimals; other numbers DIGITS + 2 significant digits


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


def position_text(state: dict[str, Any], plan: Any) -> str:
    """The position in words: 1-based epoch, batches and optimizer steps done, latest loss and rate."""
    text = f"epoch {state['epoch'] + 1}/{plan.num_epochs} · batch {state['cursor']}/{plan.batch_count}"
    text += f" · step {state['step']}/{plan.max_steps}"
    if state.get("loss") is not None:
        text += f" · loss {rounded(float(state['loss']), 4):g}"
    if state.get("learning_rate") is not None:
        text += f" · lr {rounded(float(state['learning_rate']), 3):g}"
    return text


def finite_or_none(value: Any) -> Any:
    """JSON-safe table cells: NaN and infinities become None (as Prefect's table artifacts do)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite_or_none(item) for item in value]
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    return value


def _rounded(value: Any) -> Any:
    """Numbers to DIGITS + 2 significant digits (what people read in tables and summaries)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return rounded(float(value), DIGITS + 2)
    return value


def _name(row: dict[str, Any]) -> str:
    return str(row["label"]) if row["kind"] == "entities" else f"{row['kind']}/{row['label']}"


def _prf(row: dict[str, Any]) -> str:
    return " / ".join(f"{float(row[k]):.{DIGITS - 1}f}" for k in ("precision", "recall", "f1"))


def validation_rows(validations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation table: position (1-based epoch, as in the run name), overall P/R/F1 and the per-kind and macro
    F1s that were measured (a task kind with no label in the validation schema has no column: its F1 would read 0),
    "P / R / F1" per label at eval_threshold and at the fitted thresholds (with how many of each label's false
    positives there are gold mentions of another label), then the native losses; rounded."""
    rows = []
    for entry in validations:
        row: dict[str, Any] = {"step": entry.get("step"), "epoch": int(entry.get("epoch", 0)) + 1}
        row["batch"] = entry.get("batch")
        labels = entry.get("per_label")
        absent = {key for kind, key in KIND_F1_KEYS.items() if labels and all(r["kind"] != kind for r in labels)}
        row.update({key: _rounded(entry[key]) for key in EXTRACTION_KEYS if key in entry and key not in absent})
        fitted = entry.get("per_label_fitted")
        for label in entry.get("per_label") or []:
            row[f"{_name(label)} P / R / F1"] = _prf(label)
            if not fitted and "confused" in label:  # a validation from before the fit: its confusion at eval_threshold
                row[f"{_name(label)} fp that are another label's"] = _confused(label)
        for label in fitted or []:
            at = f" at {label['threshold']:g}" if label.get("threshold") is not None else ""
            row[f"{_name(label)} fitted P / R / F1"] = _prf(label) + at
            row[f"{_name(label)} fp that are another label's"] = _confused(label)
        row.update({key: _rounded(entry.get(key)) for key in LOSS_KEYS})
        rows.append(row)
    return rows


def summary_markdown(run_key: str, summary: dict[str, Any], validations: list[dict[str, Any]]) -> str:
    """The summary artifact: where the model is, the best metric and F1, checkpoints, disk, then the validations."""
    metric = summary.get("metric_for_best", "eval_f1")
    best = summary.get("best_metric")
    best_step = summary.get("best_step")
    lines = [
        f"# GLiNER2 training run `{run_key}`",
        "",
        f"- **model exported**: `{summary.get('export')}` ({summary.get('label')} weights of step "
        f"{summary.get('export_step')})",
        f"- {describe_thresholds(summary.get('thresholds'))}",
        f"- **steps**: {summary.get('total_steps')} over {summary.get('total_epochs')} epoch(s)"
        + (" — stopped early" if summary.get("stopped_early") else ""),
        f"- **best {metric}**: {_rounded(best) if best is not None else 'n/a (no validation)'}"
        + (f" at step {best_step}" if best_step is not None else ""),
    ]
    lines += [f"- **WARNING**: {warning}" for warning in summary.get("warnings") or ()]
    chosen = next((v for v in validations if v.get("step") == best_step), None)
    if chosen is not None and "eval_f1_fitted" in chosen:
        lines.append(
            f"- **best F1** at step {best_step}, at the fitted thresholds the export ships: micro "
            f"{_rounded(chosen['eval_f1_fitted'])}, macro {_rounded(chosen['eval_macro_f1_fitted'])}"
        )
    if chosen is not None and "eval_f1" in chosen:
        lines.append(
            f"- **F1 at eval_threshold** at step {best_step}: micro {_rounded(chosen['eval_f1'])}, macro "
            f"{_rounded(chosen.get('eval_macro_f1'))} (precision {_rounded(chosen['eval_precision'])}, recall "
            f"{_rounded(chosen['eval_recall'])})"
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
    return "\n".join(lines + _validation_markdown(validations, chosen, best_step)) + "\n"


def _validation_markdown(validations: list[dict[str, Any]], chosen: dict[str, Any] | None, best_step: Any) -> list[str]:
    """The summary's validation table and, for the best validation, its per-label scores (at the fitted thresholds
    when it has them, with the F1 at eval_threshold beside them)."""
    lines: list[str] = []
    if validations:
        keys = [key for key in _TABLE_KEYS if key in validations[0]]
        lines += ["", "| step | epoch | " + "".join(f"{_TABLE_KEYS[k]} | " for k in keys) + "eval_loss |"]
        lines.append("|---:|---:|" + "---:|" * len(keys) + "---:|")
        for v in validations:
            scores = "".join(f"{_rounded(v.get(k))} | " for k in keys)
            lines.append(f"| {v.get('step')} | {int(v.get('epoch', 0)) + 1} | {scores}{v.get('eval_loss'):.6g} |")
    rows = (chosen.get("per_label_fitted") or chosen.get("per_label")) if chosen is not None else None
    if rows:
        assert chosen is not None
        at_threshold = {(r["kind"], r["label"]): r for r in chosen.get("per_label") or []}
        fitted = "per_label_fitted" in chosen
        where = " (at the fitted thresholds; F1 at eval_threshold beside)" if fitted else ""
        lines += ["", f"Per label at step {best_step}{where}:", ""]
        lines.append(
            "| kind | label | threshold | precision | recall | F1 | support | fp that are another label's |"
            + (" F1 at eval_threshold |" if fitted else "")
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if fitted else ""))
        for row in rows:
            other = at_threshold.get((row["kind"], row["label"]), {})
            lines.append(
                f"| {row['kind']} | {row['label']} | {_rounded(row.get('threshold', ''))} | "
                f"{_rounded(row['precision'])} | {_rounded(row['recall'])} | {_rounded(row['f1'])} | "
                f"{row['support']} | {_confused(row)} |" + (f" {_rounded(other.get('f1', ''))} |" if fitted else "")
            )
    return lines


# validation table columns (when the first validation has them) -> header
_TABLE_KEYS = {
    "eval_precision": "precision",
    "eval_recall": "recall",
    "eval_f1": "F1",
    "eval_macro_f1": "macro F1",
    "eval_f1_fitted": "F1 fitted",
    "eval_macro_f1_fitted": "macro F1 fitted",
}


def _confused(row: dict[str, Any]) -> str:
    """``3 (city 2, day 1)``: how many of a label's false positives are gold mentions of other labels."""
    others = row.get("confused_with") or {}
    detail = ", ".join(f"{label} {n}" for label, n in others.items())
    return f"{row.get('confused', 0)}" + (f" ({detail})" if detail else "")
