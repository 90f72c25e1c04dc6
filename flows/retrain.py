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
starting version, so a crashed retrain resumes that run (and changed settings never collide with it). The candidate,
the current model and the base model are scored record by record on the same held-out records (``test_data``, else
``valid_data``) and on the optional retention set ``guard_data``, under the same conditions (runtime/compare.py), in
the session worker that trained the candidate (``runtime.handover``; else a fresh child process); the promotion rule
(``promotion``, session_core/promotion.py) decides from a seeded paired bootstrap: better beyond noise, no
well-supported label lost, no regression on the guard set (the first candidate is always promoted). The candidate is
registered with its lineage and the decision either way; CURRENT moves only when it is promoted. The decision
(both F1s with intervals, the difference's interval, the label table with verdicts, the guard set, the rule) goes
into the lineage, a markdown artifact and the ``model.promoted`` / ``model.rejected`` event
(``flows.retrain_report``). Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed, State

from prefect_gliner2.flows.params import CheckpointSettings, ExecutionSettings, TrainingSettings
from prefect_gliner2.flows.prefect_compat import flow_run_id, interrupts_surface
from prefect_gliner2.flows.promotion_settings import DEFAULT_PROMOTION, PromotionSettings
from prefect_gliner2.flows.report_text import artifact_key
from prefect_gliner2.flows.retrain_report import emit_decision, label_run, report_decision
from prefect_gliner2.flows.train import DEFAULT_CHECKPOINTING, DEFAULT_EXECUTION, train_flow
from prefect_gliner2.model_registry import ModelRegistry, ModelVersion
from prefect_gliner2.runtime.compare import BASE, CANDIDATE, CURRENT, decide_from_scores, metrics_only
from prefect_gliner2.runtime.handover import keep_worker
from prefect_gliner2.runtime.prepare import default_storage
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.promotion import PromotionDecision
from prefect_gliner2.session_core.records import load_records
from prefect_gliner2.tasks.promotion import score_for_promotion

__all__ = ["GUARD", "data_fingerprint", "inputs_fingerprint", "retrain_flow", "retrain_run_key"]

GUARD = "guard_data"  # the retention set's name in scores and decisions


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


@flow(name="gliner2-retrain", persist_result=False)
def retrain_flow(
    model_name: str,
    train_data: str | list[str],
    valid_data: str | list[str],
    registry_root: str,
    base_model: str,
    config: TrainingSettings,
    test_data: str | list[str] | None = None,
    guard_data: str | list[str] | None = None,
    promotion: PromotionSettings = DEFAULT_PROMOTION,
    storage: str | None = None,
    checkpointing: CheckpointSettings = DEFAULT_CHECKPOINTING,
    execution: ExecutionSettings = DEFAULT_EXECUTION,
    onnx: list[Literal["fp32", "fp16", "int8"]] | None = None,
) -> State:
    """Retrain `model_name` when its data (or its training settings or base model) changed, and promote the
    candidate only when it is better beyond noise and forgot nothing the rule protects.

    Args:
        model_name: The model's name in the registry (also names the run keys and the promotion event).
        train_data: JSONL path(s) or fsspec URL(s) of the training records.
        valid_data: JSONL path(s) or URL(s) of held-out records: validation (best checkpoint) during training, and
            the candidate-vs-current comparison when `test_data` is not given (recorded in lineage and decision).
        registry_root: Local directory or fsspec URL of the model registry.
        base_model: Model source the first version starts from (a directory, a Hugging Face id or "tiny:span").
        config: Training settings of every retraining run.
        test_data: JSONL path(s) or URL(s) of separate held-out records for the comparison, so it does not reuse
            the data that selected the candidate's best checkpoint.
        guard_data: JSONL path(s) or URL(s) of a retention set (e.g. the data the current model was trained on, or
            probes with labels the new data never names) on which the candidate may not regress.
        promotion: The promotion rule: margin, confidence, bootstrap resamples and seed, per-label and guard-set
            tolerances.
        storage: Where run directories live (default: $PREFECT_GLINER2_STORAGE or ~/.prefect-gliner2/runs).
        checkpointing: The training runs' checkpoints: how often, how many kept, written in the background or not
            (see the training flow).
        execution: Batches per task, operations sent ahead, the device, and the torch threads of the training and
            scoring processes.
        onnx: Also export each candidate to ONNX for these precisions, behind the parity gate on `valid_data` (the
            training flow's ONNX step); a registered version keeps it and its lineage records the figures (``onnx``).
    """
    with interrupts_surface():
        rule = promotion.to_rule()
        registry = ModelRegistry(registry_root, model_name)
        label_run({"prefect-gliner2.model": model_name})
        data = data_fingerprint(train_data, valid_data)
        training = config.to_training_config()
        inputs = inputs_fingerprint(data, training, base_model)
        current, latest = registry.current(), registry.latest()
        if latest is not None and latest.lineage.get("inputs_fingerprint") == inputs:
            return _unchanged(registry, latest, current, data["data_fingerprint"])
        run_key = retrain_run_key(model_name, inputs, current)
        _announce(model_name, data["data_fingerprint"], latest, current, run_key, base_model)
        comparison = _comparison(test_data, valid_data, guard_data)  # refuses a set too small to compare on, first
        with keep_worker(run_key):  # the candidate's worker, handed over when its run ends well, scores it
            summary = _train_candidate(
                run_key, base_model, current, train_data, valid_data, config, storage, checkpointing, execution, onnx
            )
            scores = _score(str(summary["export"]), current, base_model, comparison, training, execution, run_key)
        guard = GUARD if guard_data is not None else None
        decision = decide_from_scores(scores, rule, test=comparison["source"], guard=guard)
        trained = _training_lineage(scores, current, summary, run_key, comparison)
        lineage = _lineage(data, inputs, model_name, base_model, trained, training, decision, comparison)
        return _register(registry, str(summary["export"]), lineage, current)


def _announce(
    model_name: str,
    fingerprint: str,
    latest: ModelVersion | None,
    current: ModelVersion | None,
    run_key: str,
    base_model: str,
) -> None:
    """Log what changed since the newest version (the dataset or the settings) and where the candidate starts."""
    changed = "dataset" if latest is None or latest.lineage.get("data_fingerprint") != fingerprint else "settings"
    get_run_logger().info(
        "new %s for %s (dataset %s): training candidate run %s from %s",
        changed,
        model_name,
        fingerprint[:12],
        run_key,
        current.version if current is not None else base_model,
    )


def _train_candidate(
    run_key: str,
    base_model: str,
    current: ModelVersion | None,
    train_data: str | list[str],
    valid_data: str | list[str],
    config: TrainingSettings,
    storage: str | None,
    checkpointing: CheckpointSettings,
    execution: ExecutionSettings,
    onnx: list[Literal["fp32", "fp16", "int8"]] | None = None,
) -> dict[str, Any]:
    """The candidate's training run: ``train_flow`` as a subflow, from the current version's weights if any (and
    its ONNX step when `onnx` names precisions)."""
    return train_flow(
        model=base_model,
        train_data=train_data,
        valid_data=valid_data,
        config=config,
        run_key=run_key,
        storage=storage or default_storage(),
        init_weights=current.uri if current is not None else None,
        checkpointing=checkpointing,
        execution=execution,
        onnx=onnx,
    )


def _score(
    export: str,
    current: ModelVersion | None,
    base_model: str,
    comparison: dict[str, Any],
    training: Any,
    execution: ExecutionSettings,
    run_key: str,
) -> dict[str, dict[str, Any]]:
    """The candidate, the current version (when there is one) and the base model scored record by record on the
    comparison sets, in the candidate run's session worker (else in a child process)."""
    models = {CANDIDATE: export, CURRENT: current.uri if current is not None else None, BASE: None}
    return score_for_promotion(
        {role: uri for role, uri in models.items() if role != CURRENT or uri is not None},
        base_model,
        comparison["data"],
        training.to_dict(),
        cpu_threads=execution.cpu_threads or 1,
        device=execution.device,
        run_key=run_key,
    )


def _lineage(
    data: dict[str, Any],
    inputs: str,
    model_name: str,
    base_model: str,
    trained: dict[str, Any],
    training: Any,
    decision: PromotionDecision,
    comparison: dict[str, Any],
) -> dict[str, Any]:
    """The candidate's lineage: its inputs, where it came from and how it scored (`trained`), and the decision."""
    return {
        **data,
        "inputs_fingerprint": inputs,
        "model_name": model_name,
        "base_model": base_model,
        **trained,
        "config": training.to_dict(),
        "promoted": decision.promote,
        "reason": _reason(decision.reasons, comparison),
        "decision": decision.to_dict(),
    }


def _training_lineage(
    scores: dict[str, dict[str, Any]],
    current: ModelVersion | None,
    summary: dict[str, Any],
    run_key: str,
    comparison: dict[str, Any],
) -> dict[str, Any]:
    """Where the candidate came from (its weights, the version it started from, its plan and run), what the models
    were compared on, their scores, and the candidate's training outcome."""
    candidate = scores[comparison["source"]][CANDIDATE]
    out = {
        "base_model_hash": candidate["base_model_hash"],
        "weights_sha256": candidate["weights_sha256"],
        "init_weights": current.version if current is not None else None,
        "manifest_fingerprint": summary["content_address"],
        "plan_fingerprint": summary["fingerprint"],
        "run_key": run_key,
        "flow_run_id": flow_run_id(),
        "comparison_data": comparison["source"],
        "comparison_records_sha256": comparison["sha256"],
        "comparison_records": comparison["records"],
        "metrics": metrics_only(scores[comparison["source"]]),
        "training": {
            k: summary.get(k) for k in ("total_steps", "metric_for_best", "best_metric", "best_step", "label")
        },
    }
    if GUARD in scores:
        out |= {"guard_records_sha256": comparison["guard_sha256"], "guard_metrics": metrics_only(scores[GUARD])}
    return out


def _reason(reasons: tuple[str, ...], comparison: dict[str, Any]) -> str:
    """The decision's reasons in one line, saying when the comparison reused the validation data."""
    return "; ".join(reasons) + comparison["note"]


def _register(registry: ModelRegistry, export: str, lineage: dict[str, Any], current: ModelVersion | None) -> State:
    """Register the candidate with its lineage (first: a crash never loses the decision), promote it when decided,
    announce and report the decision."""
    version = registry.register(export, lineage)
    model_name, promote, reason = registry.name, bool(lineage["promoted"]), str(lineage["reason"])
    label_run({"prefect-gliner2.model": model_name, "prefect-gliner2.version": version.version})
    if promote:
        registry.promote(version.version)
    emit_decision(registry, version, current, lineage)
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
        "decision": lineage["decision"],
    }
    report_decision(outcome)
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
    label_run({"prefect-gliner2.model": registry.name, "prefect-gliner2.version": latest.version})
    if latest.lineage.get("promoted") and (current is None or current.number < latest.number):
        registry.promote(latest.version)
        emit_decision(registry, latest, current, latest.lineage)
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


def _comparison(
    test_data: str | list[str] | None, valid_data: str | list[str], guard_data: str | list[str] | None
) -> dict[str, Any]:
    """Which records the candidate and the current model are compared on (and guarded by), for scoring and lineage."""
    source, data = ("test_data", test_data) if test_data is not None else ("valid_data", valid_data)
    records = _enough(load_records(data, what="test" if test_data is not None else "validation"), source)
    out: dict[str, Any] = {
        "source": source,
        "data": {source: data},
        "sha256": records.digest_hex,
        "records": len(records),
        "note": "" if test_data is not None else " (valid_data also selected the candidate's best checkpoint)",
    }
    if guard_data is not None:
        out["data"][GUARD] = guard_data
        out["guard_sha256"] = _enough(load_records(guard_data, what="guard"), GUARD).digest_hex
    return out


def _enough(records: Any, name: str) -> Any:
    if len(records) < 2:
        raise ConfigError(
            f"{name} has {len(records)} record(s); the promotion decision resamples records and needs at least 2 "
            "(a few hundred for a tight interval): pass more held-out records"
        )
    return records
