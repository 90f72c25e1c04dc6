"""How a retraining decision is announced: labels on the flow run, the ``model.promoted`` / ``model.rejected``
event, and the comparison table and decision artifacts (``flows.retrain``'s reporting; imports no torch).
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prefect_gliner2.flows.events import emit_model_event
from prefect_gliner2.flows.prefect_compat import flow_run_id
from prefect_gliner2.flows.report_text import artifact_key
from prefect_gliner2.model_registry import ModelRegistry, ModelVersion
from prefect_gliner2.runtime.compare import BASE, CANDIDATE, CURRENT
from prefect_gliner2.runtime.events import MODEL_PROMOTED, MODEL_REJECTED
from prefect_gliner2.session_core.metrics import EVAL_KEYS
from prefect_gliner2.session_core.promotion import PromotionDecision
from prefect_gliner2.session_core.promotion_report import decision_markdown

__all__ = ["emit_decision", "label_run", "report_decision"]


def emit_decision(
    registry: ModelRegistry, version: ModelVersion, previous: ModelVersion | None, lineage: dict[str, Any]
) -> None:
    """model.promoted or model.rejected, with absolute URIs of the version, the previous one and the registry, and
    the decision's numbers (both F1s with intervals, the difference's interval, the label table, guard set, rule)."""
    emit_model_event(
        MODEL_PROMOTED if lineage.get("promoted") else MODEL_REJECTED,
        registry.name,
        version.version,
        {
            "uri": version.uri,
            "registry": registry.root,
            "previous": previous.version if previous is not None else None,
            "previous_uri": previous.uri if previous is not None else None,
            "reason": lineage.get("reason"),
            "data_fingerprint": lineage.get("data_fingerprint"),
            "metrics": lineage.get("metrics"),
            "decision": lineage.get("decision"),
            "run_key": lineage.get("run_key"),
            "flow_run_id": flow_run_id(),
        },
    )


def label_run(labels: dict[str, Any]) -> None:
    """Labels on this flow run (model and version), so runs can be found per model in the UI."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    current = flow_run_id()
    if current is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run_labels(UUID(current), labels)


def report_decision(outcome: dict[str, Any]) -> None:
    """A table artifact of both models' metrics, and the decision as markdown (verdict, reasons, F1s with intervals,
    the label table with verdicts, the guard set, the rule)."""
    name, metrics = outcome["model_name"], outcome["metrics"]
    candidate, current = metrics[CANDIDATE], metrics.get(CURRENT, {})
    rows = [
        {
            "metric": key,
            "candidate": candidate.get(key),
            "current": current.get(key),
            "base": metrics.get(BASE, {}).get(key),
            "difference": (candidate[key] - current[key]) if key in current else None,
        }
        for key in EVAL_KEYS
        if key in candidate
    ]
    create_table_artifact(
        key=artifact_key(f"model-{name}", "comparison"),
        table=rows,
        description=f"{name}: candidate {outcome['version']} vs current {outcome['previous']}",
    )
    decision = PromotionDecision.from_dict(outcome["decision"])
    create_markdown_artifact(
        key=artifact_key(f"model-{name}", "retrain"),
        markdown=(
            f"# Retraining {name}: candidate {outcome['version']} against current {outcome['previous']}\n\n"
            f"{decision_markdown(decision)}\n"
            f"Current version now: **{outcome['current']}**. Run key `{outcome['run_key']}`, dataset "
            f"`{outcome['data_fingerprint'][:16]}`.\n"
        ),
        description=f"{name} retraining decision",
    )
