"""The scheduled retraining flow: retrain a registered model when its inputs changed, promote only a better one.

    from prefect_gliner2.flows.retrain import retrain_flow

    outcome = retrain_flow(model_name="ner", train_data="s3://bucket/ner/train.jsonl",
                           valid_data="s3://bucket/ner/valid.jsonl", registry_root="s3://bucket/registry",
                           base_model="fastino/gliner2-base-v1", config={"fp16": False, "bf16": False})
    outcome["status"]        # "unchanged", "promoted" or "rejected"

Each run fingerprints the dataset (sha256 over the train and validation records' content digests) and its inputs
(the dataset, the training settings that change the numbers and the base model). When the newest registered version
was trained from the same inputs, it finishes at once ("nothing to do"). Otherwise it trains a candidate with
``train_flow`` (a subflow) starting from the current production model's weights (fresh optimizer and schedule; the
base model for the first version), under a run key derived from the model name, the inputs fingerprint and the
starting version, so a crashed retrain resumes that run (and changed settings never collide with it). Candidate
and current model are scored on the same held-out records (``test_data``, else ``valid_data``) in a child process,
by extraction F1 unless another ``metric`` is named; the candidate is registered with its lineage either way and
CURRENT moves only when it beats the current model by ``margin`` (the first candidate is always promoted; a
candidate with F1 0 never replaces a model whose F1 is not 0).
Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.states import Completed, State
from pydantic import Field

from prefect_gliner2.flows.context import flow_run_id
from prefect_gliner2.flows.events import emit_model_event
from prefect_gliner2.flows.params import CheckpointSettings, ExecutionSettings, TrainingSettings
from prefect_gliner2.flows.report_text import artifact_key
from prefect_gliner2.flows.train import DEFAULT_CHECKPOINTING, DEFAULT_EXECUTION, train_flow
from prefect_gliner2.model_registry import ModelRegistry, ModelVersion
from prefect_gliner2.runtime.events import MODEL_PROMOTED, MODEL_REJECTED
from prefect_gliner2.runtime.prepare import default_storage
from prefect_gliner2.session_core.metrics import DEFAULT_METRIC, EVAL_KEYS, greater_is_better_for
from prefect_gliner2.session_core.records import load_records
from prefect_gliner2.tasks.heldout import evaluate_models

__all__ = ["data_fingerprint", "decide", "inputs_fingerprint", "retrain_flow", "retrain_run_key"]


def data_fingerprint(train_data: str | list[str], valid_data: str | list[str]) -> dict[str, Any]:
    """Content fingerprint of a dataset: sha256 over its train and validation records' digests (order-sensitive)."""
    train = load_records(train_data, what="training").digest_hex
    valid = load_records(valid_data, what="validation").digest_hex
    combined = hashlib.sha256(json.dumps({"train": train, "valid": valid}, sort_keys=True).encode()).hexdigest()
    return {"data_fingerprint": combined, "train_records_sha256": train, "valid_records_sha256": valid}


def inputs_fingerprint(data: dict[str, Any], config: Any, base_model: str) -> str:
    """What a candidate is trained from: the data fingerprint, every training setting that changes the numbers
    (``TrainingConfig.fingerprint_fields``) and the base model source. A change to any of them retrains."""
    payload = {"data": data["data_fingerprint"], "config": config.fingerprint_fields(), "base_model": base_model}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def retrain_run_key(model_name: str, fingerprint: str, base: ModelVersion | None) -> str:
    """`retrain-<name>-<inputs fingerprint>-<starting version>`: the same inputs resume the same run."""
    return f"retrain-{model_name[:64]}-{fingerprint[:16]}-{base.version if base is not None else 'base'}"


def decide(
    candidate: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    *,
    metric: str = DEFAULT_METRIC,
    greater_is_better: bool = True,
    margin: float = 0.0,
    data: str = "valid_data",
) -> tuple[bool, str]:
    """Whether the candidate replaces the current model, and why in words: both models' F1 (and the metric when it
    is another one) and the data they were measured on. A candidate whose F1 is 0 never replaces a model whose F1
    is not, whatever the metric says."""
    scores = f"candidate {_describe(candidate, metric)}"
    if current is None:
        return True, f"there is no current model: the first candidate is promoted ({scores}, on {data})"
    scores += f", current model {_describe(current, metric)}, on {data}"
    if candidate.get("eval_f1") == 0.0 and float(current.get("eval_f1") or 0.0) > 0.0:
        return False, f"{scores}: a candidate that extracts nothing correct (F1 0) never replaces one that does"
    value, reference = float(candidate[metric]), float(current[metric])
    better = value > reference + margin if greater_is_better else value < reference - margin
    relation = "above" if greater_is_better else "below"
    verdict = "is" if better else "is not"
    return better, f"{scores}: the candidate's {metric} {verdict} more than {margin:g} {relation} the current model's"


def _describe(scores: Mapping[str, Any], metric: str) -> str:
    parts = [f"F1 {float(scores['eval_f1']):.4f}"] if "eval_f1" in scores else []
    if metric != "eval_f1":
        parts.append(f"{metric} {float(scores[metric]):.6g}")
    return " / ".join(parts)


@flow(name="gliner2-retrain", persist_result=False)
def retrain_flow(
    model_name: str,
    train_data: str | list[str],
    valid_data: str | list[str],
    registry_root: str,
    base_model: str,
    config: TrainingSettings,
    metric: str = DEFAULT_METRIC,
    greater_is_better: bool | None = None,
    margin: Annotated[float, Field(ge=0)] = 0.0,
    test_data: str | list[str] | None = None,
    storage: str | None = None,
    checkpointing: CheckpointSettings = DEFAULT_CHECKPOINTING,
    execution: ExecutionSettings = DEFAULT_EXECUTION,
) -> State:
    """Retrain `model_name` when its data (or its training settings or base model) changed, and promote the
    candidate only when it is better.

    Args:
        model_name: The model's name in the registry (also names the run keys and the promotion event).
        train_data: JSONL path(s) or fsspec URL(s) of the training records.
        valid_data: JSONL path(s) or URL(s) of held-out records: validation (best checkpoint) during training, and
            the candidate-vs-current comparison when `test_data` is not given (recorded in lineage and decision).
        registry_root: Local directory or fsspec URL of the model registry.
        base_model: Model source the first version starts from (a directory, a Hugging Face id or "tiny:span").
        config: Training settings of every retraining run.
        metric: Promotion metric: eval_f1 (default), eval_precision, eval_recall, eval_entity_f1,
            eval_relation_f1, eval_classification_f1, eval_structure_f1, eval_macro_f1, or a loss (eval_loss, ...).
        greater_is_better: Whether a higher metric is better (default: yes for P/R/F1, no for losses).
        margin: How much better than the current model the candidate must be to be promoted.
        test_data: JSONL path(s) or URL(s) of separate held-out records for the comparison, so it does not reuse
            the data that selected the candidate's best checkpoint.
        storage: Where run directories live (default: $PREFECT_GLINER2_STORAGE or ~/.prefect-gliner2/runs).
        checkpointing: The training runs' checkpoints: how often, how many kept, written in the background or not
            (see the training flow).
        execution: Batches per task, operations sent ahead, the device, and the torch threads of the training and
            evaluation processes.
    """
    if metric not in EVAL_KEYS:
        raise ValueError(f"metric {metric!r} is not one of {list(EVAL_KEYS)}; pick one of those (default eval_f1)")
    if greater_is_better is None:
        greater_is_better = greater_is_better_for(metric)
    registry = ModelRegistry(registry_root, model_name)
    _label_run({"prefect-gliner2.model": model_name})
    data = data_fingerprint(train_data, valid_data)
    fingerprint = data["data_fingerprint"]
    training = config.to_training_config()
    inputs = inputs_fingerprint(data, training, base_model)
    current, latest = registry.current(), registry.latest()
    if latest is not None and latest.lineage.get("inputs_fingerprint") == inputs:
        return _unchanged(registry, latest, current, fingerprint)
    run_key = retrain_run_key(model_name, inputs, current)
    changed = "dataset" if latest is None or latest.lineage.get("data_fingerprint") != fingerprint else "settings"
    get_run_logger().info(
        "new %s for %s (dataset %s): training candidate run %s from %s",
        changed,
        model_name,
        fingerprint[:12],
        run_key,
        current.version if current is not None else base_model,
    )
    summary = train_flow(
        model=base_model,
        train_data=train_data,
        valid_data=valid_data,
        config=config,
        run_key=run_key,
        storage=storage or default_storage(),
        init_weights=current.uri if current is not None else None,
        checkpointing=checkpointing,
        execution=execution,
    )
    comparison = _comparison(test_data, valid_data)
    scores = _score_candidate(str(summary["export"]), current, base_model, comparison, training, execution)
    promote, reason = decide(
        scores["candidate"],
        scores.get("current") if current is not None else None,
        metric=metric,
        greater_is_better=greater_is_better,
        margin=margin,
        data=comparison["description"],
    )
    lineage = {
        **data,
        "inputs_fingerprint": inputs,
        "model_name": model_name,
        "base_model": base_model,
        **_training_lineage(scores, current, summary, run_key, comparison),
        "config": training.to_dict(),
        "metric": metric,
        "greater_is_better": greater_is_better,
        "margin": margin,
        "promoted": promote,
        "reason": reason,
    }
    return _register(registry, str(summary["export"]), lineage, current, metric)


def _score_candidate(
    candidate: str,
    current: ModelVersion | None,
    base_model: str,
    comparison: dict[str, Any],
    training: Any,
    execution: ExecutionSettings,
) -> dict[str, dict[str, Any]]:
    """The candidate's and the current model's scores on the comparison records, in a child process."""
    models = {"candidate": candidate}
    if current is not None:
        models["current"] = current.uri
    threads = execution.cpu_threads or 1
    return evaluate_models(
        models, base_model, comparison["data"], training.to_dict(), cpu_threads=threads, device=execution.device
    )


def _training_lineage(
    scores: dict[str, dict[str, Any]],
    current: ModelVersion | None,
    summary: dict[str, Any],
    run_key: str,
    comparison: dict[str, Any],
) -> dict[str, Any]:
    """Where the candidate came from (its weights, the version it started from, its plan and run), what the models
    were compared on, their metrics, and the candidate's training outcome."""
    return {
        "base_model_hash": scores["candidate"]["base_model_hash"],
        "weights_sha256": scores["candidate"]["weights_sha256"],
        "init_weights": current.version if current is not None else None,
        "manifest_fingerprint": summary["content_address"],
        "plan_fingerprint": summary["fingerprint"],
        "run_key": run_key,
        "flow_run_id": flow_run_id(),
        "comparison_data": comparison["source"],
        "comparison_records_sha256": comparison["sha256"],
        "comparison_records": comparison["records"],
        "metrics": {label: _metrics(values) for label, values in scores.items()},
        "training": {k: summary.get(k) for k in ("total_steps", "best_metric", "best_step", "label")},
    }


def _register(
    registry: ModelRegistry, export: str, lineage: dict[str, Any], current: ModelVersion | None, metric: str
) -> State:
    """Register the candidate with its lineage (first: a crash never loses the decision), promote it when decided,
    announce and report the decision."""
    version = registry.register(export, lineage)
    model_name, promote, reason = registry.name, bool(lineage["promoted"]), str(lineage["reason"])
    _label_run({"prefect-gliner2.model": model_name, "prefect-gliner2.version": version.version})
    if promote:
        registry.promote(version.version)
    _emit_decision(registry, version, current, lineage)
    now_current = version if promote else current
    outcome = {
        "status": "promoted" if promote else "rejected",
        "model_name": model_name,
        "version": version.version,
        "uri": version.uri,
        "current": now_current.version if now_current is not None else None,
        "previous": current.version if current is not None else None,
        "reason": reason,
        "data_fingerprint": lineage["data_fingerprint"],
        "run_key": lineage["run_key"],
        "metrics": lineage["metrics"],
    }
    _report(outcome, metric)
    get_run_logger().info("%s %s: %s", model_name, version.version, reason)
    message = (
        f"promoted {model_name} {version.version}"
        if promote
        else f"registered {model_name} {version.version} without promoting it"
    ) + f": {reason}"
    return Completed(message=message, data=outcome)


def _unchanged(registry: ModelRegistry, latest: ModelVersion, current: ModelVersion | None, fingerprint: str) -> State:
    """Nothing to train; finish a promotion an interrupted run decided but did not apply."""
    logger = get_run_logger()
    status = "unchanged"
    _label_run({"prefect-gliner2.model": registry.name, "prefect-gliner2.version": latest.version})
    if latest.lineage.get("promoted") and (current is None or current.number < latest.number):
        registry.promote(latest.version)
        _emit_decision(registry, latest, current, latest.lineage)
        current, status = latest, "promoted"
        logger.info("completed the interrupted promotion of %s %s", registry.name, latest.version)
    message = (
        f"nothing to do: {registry.name} {latest.version} was already trained on dataset {fingerprint[:12]} "
        f"with these settings; current version {current.version if current is not None else None}"
    )
    logger.info(message)
    outcome = {
        "status": status,
        "model_name": registry.name,
        "version": latest.version,
        "current": current.version if current is not None else None,
        "data_fingerprint": fingerprint,
        "reason": message,
    }
    create_markdown_artifact(
        key=artifact_key(f"model-{registry.name}", "retrain"),
        markdown=f"## Retraining {registry.name}\n\n"
        f"Nothing to do: the dataset (`{fingerprint[:16]}`), settings and base model are the "
        f"ones {latest.version} was trained with. Current version: {outcome['current']}.\n",
        description=message,
    )
    return Completed(message=message, data=outcome)


def _comparison(test_data: str | list[str] | None, valid_data: str | list[str]) -> dict[str, Any]:
    """Which records the candidate and the current model are compared on, described for lineage and decision."""
    source, data = ("test_data", test_data) if test_data is not None else ("valid_data", valid_data)
    records = load_records(data, what="test" if test_data is not None else "validation")
    count = len(records)
    note = "" if test_data is not None else ", the data that also selected the candidate's best checkpoint"
    return {
        "source": source,
        "data": data,
        "sha256": records.digest_hex,
        "records": count,
        "description": f"{source} ({count} records{note})",
    }


def _metrics(values: dict[str, Any]) -> dict[str, Any]:
    keys = (*EVAL_KEYS, "per_label", "examples", "uri", "thresholds", "threshold_source")
    return {k: values[k] for k in keys if k in values}


def _emit_decision(
    registry: ModelRegistry, version: ModelVersion, previous: ModelVersion | None, lineage: dict[str, Any]
) -> None:
    """model.promoted or model.rejected, with absolute URIs of the version, the previous one and the registry."""
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
            "run_key": lineage.get("run_key"),
            "flow_run_id": flow_run_id(),
        },
    )


def _label_run(labels: dict[str, Any]) -> None:
    """Labels on this flow run (model and version), so runs can be found per model in the UI."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    current = flow_run_id()
    if current is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run_labels(UUID(current), labels)


def _report(outcome: dict[str, Any], metric: str) -> None:
    name, metrics = outcome["model_name"], outcome["metrics"]
    candidate, current = metrics["candidate"], metrics.get("current", {})
    rows = [
        {
            "metric": key,
            "candidate": candidate.get(key),
            "current": current.get(key),
            "difference": (candidate[key] - current[key]) if key in current and key in candidate else None,
        }
        for key in EVAL_KEYS
        if key in candidate
    ]
    create_table_artifact(
        key=artifact_key(f"model-{name}", "comparison"),
        table=rows,
        description=f"{name}: candidate {outcome['version']} vs current {outcome['previous']}",
    )
    decision = "promoted" if outcome["status"] == "promoted" else "not promoted"
    create_markdown_artifact(
        key=artifact_key(f"model-{name}", "retrain"),
        markdown=(
            f"## Retraining {name}: {outcome['version']} {decision}\n\n{outcome['reason']} ({metric}).\n\n"
            f"| | version | F1 | precision | recall | {metric} |\n|---|---|---:|---:|---:|---:|\n"
            f"| candidate | {outcome['version']} | {_cells(candidate, metric)} |\n"
            f"| current | {outcome['previous']} | {_cells(current, metric)} |\n\n"
            f"Current version now: **{outcome['current']}**. Run key `{outcome['run_key']}`, dataset "
            f"`{outcome['data_fingerprint'][:16]}`.\n"
        ),
        description=f"{name} retraining decision",
    )


def _cells(scores: Mapping[str, Any], metric: str) -> str:
    keys = ("eval_f1", "eval_precision", "eval_recall", metric)
    return " | ".join("" if scores.get(k) is None else f"{float(scores[k]):.4g}" for k in keys)
