"""The bundled demo: train the built-in tiny span model on generated records through the training flow, offline.

    prefect-gliner2 demo --dir ./demo
    # or: python -c "from prefect_gliner2.flows.demo import run_demo; run_demo('./demo')"

It writes ``data/train.jsonl``, ``data/valid.jsonl`` and ``config.yaml`` under the directory, trains run key
``demo`` with run directories under ``runs/`` and exports the selected model to ``model/``. Running it again finds
the finished run and returns at once; delete the directory to start over.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["DEMO_CONFIG", "run_demo", "write_demo_inputs"]

DEMO_CONFIG: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "num_epochs": 2,
    "batch_size": 4,
    "gradient_accumulation_steps": 2,
    "eval_strategy": "epoch",
    "encoder_lr": 1e-3,
    "task_lr": 2e-3,
    "warmup_ratio": 0.1,
    "seed": 7,
}


def write_demo_inputs(directory: str, *, train_records: int = 32, valid_records: int = 8) -> dict[str, str]:
    """Generate the demo dataset and config (deterministic); returns their paths."""
    from prefect_gliner2.session_core.tiny import tiny_records

    data = os.path.join(directory, "data")
    os.makedirs(data, exist_ok=True)
    paths = {
        "train": os.path.join(data, "train.jsonl"),
        "valid": os.path.join(data, "valid.jsonl"),
        "config": os.path.join(directory, "config.yaml"),
    }
    for key, records in (
        ("train", tiny_records(train_records, seed=1)),
        ("valid", tiny_records(valid_records, seed=2)),
    ):
        with open(paths[key], "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with open(paths["config"], "w", encoding="utf-8") as handle:
        handle.writelines(f"{key}: {json.dumps(value)}\n" for key, value in DEMO_CONFIG.items())
    return paths


def run_demo(directory: str = "prefect-gliner2-demo") -> dict[str, Any]:
    """Run the demo flow; returns the flow's summary (``export`` is the trained model)."""
    from prefect_gliner2.flows.params import TrainingSettings
    from prefect_gliner2.flows.train import train_flow
    from prefect_gliner2.runtime.errors import RunConflictError
    from prefect_gliner2.session_core import TrainingConfig

    directory = os.path.abspath(directory)
    paths = write_demo_inputs(directory)
    config = TrainingConfig.from_file(paths["config"])
    try:
        return train_flow(
            model="tiny:span",
            train_data=paths["train"],
            valid_data=paths["valid"],
            config=TrainingSettings.model_validate(config),
            run_key="demo",
            storage=os.path.join(directory, "runs"),
            export_to=os.path.join(directory, "model"),
            checkpoint_every=4,
            batches_per_task=1,
        )
    except RunConflictError as exc:
        raise RunConflictError(
            f"the demo directory {directory} holds a demo run with a different plan (made by another version of "
            f"prefect-gliner2?): delete that directory to start the demo over, or pass another --dir. ({exc})"
        ) from exc
