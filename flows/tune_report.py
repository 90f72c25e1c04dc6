"""What a tuning study shows: the leaderboard (one row per trial: parameters, metric, state, updates trained, flow run
link, where its run stands), published as a table artifact, and the best trial's model registered on request.

Rows are read from the study's storage, so a study reopened later (or by ``optuna-dashboard`` on the same storage
URL) shows the same trials. Completed trials come first, best first by the selection metric; then pruned ones, by
the metric at their pause point; then failed ones.
"""

from __future__ import annotations

import json
import math
from typing import Any

from prefect_gliner2.flows.report_text import artifact_key, rounded

__all__ = ["best_row", "leaderboard_rows", "publish_leaderboard", "register_best"]

COLUMNS = ("rank", "trial", "state", "params", "metric", "value", "steps", "run_key", "flow_run", "export", "note")
_ORDER = {"COMPLETE": 0, "PRUNED": 1, "RUNNING": 2, "FAIL": 3, "WAITING": 4}


def leaderboard_rows(trials: list[Any], metric: str, greater: bool) -> list[dict[str, Any]]:
    """One row per trial, best first (see the module docstring)."""
    by = {t.user_attrs["continues"]: t.number for t in trials if "continues" in t.user_attrs}
    rows = [_row(trial, metric, by.get(trial.number)) for trial in trials]

    def order(row: dict[str, Any]) -> tuple[int, float, int]:
        value = row["value"]
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        score = math.inf if missing else (-value if greater else value)
        return (_ORDER.get(row["state"], 5), score, row["trial"])

    rows.sort(key=order)
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    return rows


def _row(trial: Any, metric: str, continued_by: int | None) -> dict[str, Any]:
    attrs = trial.user_attrs
    runs = attrs.get("flow_runs") or []
    value = trial.value if trial.value is not None else _last_intermediate(trial)
    return {
        "trial": trial.number,
        "state": trial.state.name,
        "params": json.dumps(trial.params, sort_keys=True),
        "metric": metric,
        "value": value,
        "steps": attrs.get("steps"),
        "run_key": attrs.get("run_key"),
        "flow_run": _flow_run_link(runs[-1]) if runs else None,
        "export": attrs.get("export") if trial.state.name == "COMPLETE" else None,
        "note": _note(trial, continued_by),
    }


def _last_intermediate(trial: Any) -> float | None:
    values = trial.intermediate_values
    return values[max(values)] if values else None


def _note(trial: Any, continued_by: int | None) -> str:
    attrs, state = trial.user_attrs, trial.state.name
    parts = []
    if "continues" in attrs:
        parts.append(f"continues trial {attrs['continues']}")
    if state == "PRUNED" and continued_by is not None:
        parts.append(f"pruned at checkpoint {attrs.get('checkpoint')}; continued by trial {continued_by}")
    elif state == "PRUNED":
        parts.append(f"paused at checkpoint {attrs.get('checkpoint')}: continue it with its trial number")
    if state == "FAIL":
        parts.append(str(attrs.get("error") or ("abandoned before training" if attrs.get("abandoned") else "")))
    return "; ".join(p for p in parts if p)


def _flow_run_link(flow_run_id: str) -> str:
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui else str(flow_run_id)


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best completed trial's row (rows are sorted), or None when no trial completed."""
    return next((row for row in rows if row["state"] == "COMPLETE" and row["value"] is not None), None)


def publish_leaderboard(study_key: str, rows: list[dict[str, Any]]) -> None:
    from prefect.artifacts import create_table_artifact

    metric = rows[0]["metric"] if rows else "the selection metric"
    create_table_artifact(
        [{name: rounded(row[name]) for name in COLUMNS} for row in rows],
        key=artifact_key(f"tune-{study_key}", "leaderboard"),
        description=f"study {study_key}: one row per trial, best {metric} first; pruned trials are paused, not lost",
    )


def register_best(
    best: dict[str, Any], registry_root: str, model_name: str, study_key: str, storage_url: str
) -> dict[str, Any]:
    """Register the best trial's export as a new version (not promoted); a version this study registered for the
    same trial already is returned instead (a study run again registers nothing twice)."""
    from prefect_gliner2.model_registry import ModelRegistry

    registry = ModelRegistry(registry_root, model_name)
    for version in registry.versions():
        lineage = version.lineage
        if lineage.get("study_key") == study_key and lineage.get("trial") == best["trial"]:
            return {"version": version.version, "uri": version.uri, "new": False}
    lineage = {
        "study_key": study_key,
        "study_storage": storage_url,
        "trial": best["trial"],
        "params": json.loads(best["params"]),
        "run_key": best["run_key"],
        "metric": best["metric"],
        "value": best["value"],
    }
    version = registry.register(str(best["export"]), lineage)
    return {"version": version.version, "uri": version.uri, "new": True}
