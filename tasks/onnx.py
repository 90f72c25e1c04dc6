"""The ONNX step's task: a run's exported model as an ONNX export behind the parity gate, in a spawned process.

Torch loads in that process only (the flow process stays torch-free). A retry, or a rerun of a completed run, finds
an export that an earlier attempt committed and returns its record; a refusal by the gate (``ParityError``, with
the figures) is deterministic and not retried.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.model_registry.store import onnx_lineage
from prefect_gliner2.runtime.errors import retry_if_transient
from prefect_gliner2.runtime.onnx_step import export_run_onnx, onnx_out

__all__ = ["export_onnx_step"]


@task(
    name="export-onnx",
    task_run_name="export ONNX ({precisions})",
    cache_policy=NO_CACHE,
    retries=1,
    retry_condition_fn=retry_if_transient,
)
def export_onnx_step(export_uri: str, manifest_uri: str, precisions: Sequence[str], seed: int) -> dict[str, Any]:
    """Export the run's model (`export_uri`) to its onnx/ folder for `precisions`, gated on the run's validation
    records; returns where it is and each precision's parity figures (what a registry lineage records)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        record, reused = pool.submit(export_run_onnx, export_uri, manifest_uri, list(precisions), seed).result()
    out = onnx_out(export_uri)
    logger = get_run_logger()
    for precision, entry in record["precisions"].items():
        parity = entry["parity"]
        logger.info(
            "ONNX %s at %s%s: span agreement %.4f, max |score diff| %.2e, micro F1 %.4f vs torch %.4f (%+.4f) on "
            "%d validation records: parity gate passed",
            precision,
            out,
            " (exported by an earlier attempt)" if reused else "",
            parity["span_agreement"],
            parity["max_score_diff"],
            parity["f1_onnx"],
            parity["f1_torch"],
            parity["f1_diff"],
            parity["records"],
        )
    return onnx_lineage(out, record)
