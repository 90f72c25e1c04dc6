"""The bundled demo: train a built-in tiny span model on generated records through the training flow, offline, and
show that it learned: held-out F1 before and after, and a few extractions.

    prefect-gliner2 demo --dir ./demo
    # or: python -c "from prefect_gliner2.flows.demo import run_demo; run_demo('./demo')"

It writes ``data/train.jsonl``, ``data/valid.jsonl`` (validation: picks the best checkpoint by F1),
``data/test.jsonl`` (held out: only scored) and ``config.yaml`` under the directory, trains run key ``demo`` with
run directories under ``runs/`` and exports the selected model to ``model/``. Running it again finds the finished
run and returns at once (the scoring runs again); delete the directory to start over.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["DEMO_CONFIG", "DEMO_MODEL", "DEMO_ORDERS", "DEMO_SIZES", "demo_report", "run_demo", "write_demo_inputs"]

# A DeBERTa-v3-style encoder: relative attention lets a model learn labels rather than their places in the prompt
# (a tiny BERT, with absolute positions, scored 0.03-0.56 under other label orders after training)
DEMO_MODEL = "tiny:span:64x2:deberta"
DEMO_ORDERS = 8  # held-out records scored under this many seeded random label orders
DEMO_SIZES: dict[str, int] = {"train": 300, "valid": 40, "test": 60, "examples": 3}
DEMO_CONFIG: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "num_epochs": 8,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "eval_strategy": "epoch",
    "encoder_lr": 1e-3,
    "task_lr": 2e-3,
    "warmup_ratio": 0.1,
    "seed": 7,
}
_SEEDS = {"train": 1, "valid": 2, "test": 3}


def write_demo_inputs(directory: str) -> dict[str, str]:
    """Generate the demo dataset and config (deterministic); returns their paths."""
    from prefect_gliner2.training.tiny import tiny_records

    data = os.path.join(directory, "data")
    os.makedirs(data, exist_ok=True)
    paths = {key: os.path.join(data, f"{key}.jsonl") for key in _SEEDS}
    paths["config"] = os.path.join(directory, "config.yaml")
    for key, seed in _SEEDS.items():
        with open(paths[key], "w", encoding="utf-8") as handle:
            records = tiny_records(DEMO_SIZES[key], seed=seed)
            handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with open(paths["config"], "w", encoding="utf-8") as handle:
        handle.writelines(f"{key}: {json.dumps(value)}\n" for key, value in DEMO_CONFIG.items())
    return paths


def run_demo(directory: str = "prefect-gliner2-demo") -> dict[str, Any]:
    """Score the untrained model on the held-out records, run the demo flow, score the exported model; returns the
    flow's summary plus ``demo`` (held-out metrics before and after, example extractions)."""
    from prefect_gliner2.flows.params import CheckpointSettings, ExecutionSettings, TrainingSettings
    from prefect_gliner2.flows.train import train_flow
    from prefect_gliner2.runtime.errors import RunConflictError
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core import TrainingConfig

    directory = os.path.abspath(directory)
    paths = write_demo_inputs(directory)
    config = TrainingConfig.from_file(paths["config"])
    before = _score(load_model(DEMO_MODEL), paths["test"], config)
    try:
        summary = train_flow(
            model=DEMO_MODEL,
            train_data=paths["train"],
            valid_data=paths["valid"],
            config=TrainingSettings.model_validate(config),
            run_key="demo",
            storage=os.path.join(directory, "runs"),
            export_to=os.path.join(directory, "model"),
            checkpointing=CheckpointSettings(checkpoint_every=0),
            execution=ExecutionSettings(batches_per_task=8),
        )
    except RunConflictError as exc:
        raise RunConflictError(
            f"the demo directory {directory} holds a demo run with a different plan (made by another version of "
            f"prefect-gliner2?): delete that directory to start the demo over, or pass another --dir. ({exc})"
        ) from exc
    from prefect_gliner2.session_core.thresholds import read_thresholds
    from prefect_gliner2.training.weights import load_exported_model

    export = str(summary["export"])
    fitted = read_thresholds(export)  # fitted on the validation records at export; the demo extracts with them
    after = _score(load_exported_model(export), paths["test"], config, examples=DEMO_SIZES["examples"], fitted=fitted)
    return {**summary, "demo": {"test_data": paths["test"], "before": before, "after": after}}


def _score(model: Any, test_data: str, config: Any, *, examples: int = 0, fitted: Any = None) -> dict[str, Any]:
    """Held-out scores of `model` with gliner2's batched inference at its `fitted` thresholds (else the config's
    eval_threshold), each record's labels asked in a seeded random order (as a user's code asks them), the F1
    spread over DEMO_ORDERS orders, and the first `examples` extractions."""
    from prefect_gliner2.session_core.evaluation import label_f1_order_min, order_metrics, order_reports
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records
    from prefect_gliner2.session_core.thresholds import fixed
    from prefect_gliner2.training.inference import model_extractor

    pairs = to_pairs(load_records(test_data, what="held-out").examples())
    thresholds = fitted if fitted is not None else fixed(config.eval_threshold)
    extract = model_extractor(model, threshold=thresholds, batch_size=config.eval_batch_size)
    shown: list[dict[str, Any]] = []

    def keep(texts: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        predictions = extract(texts, schemas)
        if not shown:  # the first pass: the default shuffled order
            shown.extend(
                {"text": t, "predicted": p.get("entities", {})}
                for t, p in zip(texts[:examples], predictions, strict=False)
            )
        return predictions

    reports, canonical = order_reports(pairs, keep, seed=int(config.seed), trials=DEMO_ORDERS)
    report, order = reports[0], order_metrics(reports, canonical)
    for item, (_, gold) in zip(shown, pairs, strict=False):
        item["gold"] = gold.get("entities", {})
    total = report.total()
    return {
        **report.metrics(),
        **order,
        "orders": DEMO_ORDERS,
        "records": report.records,
        "tp": total.tp,
        "fp": total.fp,
        "fn": total.fn,
        "per_label": report.rows(),
        "label_f1_order_min": label_f1_order_min(reports),
        "total": report.to_dict()["total"],
        "examples": shown,
        "thresholds": thresholds.to_dict(),
    }


def demo_report(demo: dict[str, Any]) -> str:
    """What the demo prints at the end: held-out F1 (micro and macro) before and after training, the trained model's
    per-label table, a WARNING for a label with gold mentions at F1 0, and example extractions."""
    from prefect_gliner2.session_core.run_warnings import label_warning
    from prefect_gliner2.session_core.score_text import label_table
    from prefect_gliner2.session_core.thresholds import describe

    before, after = demo["before"], demo["after"]
    lines = [
        f"held-out F1 on {after['records']} unseen records ({demo['test_data']}):",
        f"  before training: F1 {before['eval_f1']:.3f}, macro F1 {before['eval_macro_f1']:.3f} (precision "
        f"{before['eval_precision']:.3f}, recall {before['eval_recall']:.3f})",
        f"  after training:  F1 {after['eval_f1']:.3f}, macro F1 {after['eval_macro_f1']:.3f} (precision "
        f"{after['eval_precision']:.3f}, recall {after['eval_recall']:.3f}; {after['tp']} correct, {after['fp']} "
        f"wrong, {after['fn']} missed)",
        f"  labels asked in a random order per record, as users ask them; over {after['orders']} orders F1 "
        f"{after['eval_f1_order_min']:.3f}-{after['eval_f1_order_max']:.3f} "
        f"(in the training data's own order {after['eval_f1_canonical']:.3f})",
        f"  each label's lowest F1 over the {after['orders']} orders: "
        + ", ".join(f"{name} {f1:.3f}" for name, f1 in after["label_f1_order_min"].items()),
        f"  {describe(after['thresholds'])}",
        "per label after training (first order):",
        *label_table(after["per_label"], after["total"], indent="  "),
    ]
    warning = label_warning(after["per_label"], "the held-out records")
    lines += [f"WARNING: {warning}"] if warning else []
    lines.append("example extractions by the trained model:")
    for item in after["examples"]:
        lines.append(f"  text:      {item['text']}")
        lines.append(f"  extracted: {_entities(item['predicted'])}")
        lines.append(f"  gold:      {_entities(item['gold'])}")
    return "\n".join(lines)


def _entities(entities: dict[str, Any]) -> str:
    found = [f"{label}: {', '.join(map(str, values))}" for label, values in entities.items() if values]
    return "; ".join(found) or "(nothing)"
