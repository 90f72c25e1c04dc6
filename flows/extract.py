"""The ``gliner2-extract`` flow: a registry model (its CURRENT version by default) over a large JSONL input on any
fsspec storage, in cached, retry-safe chunk tasks, the output published atomically at the end.

A crash, a retry or a new run with the same parameters continues the job: chunks already committed are cache hits
(or read back from their parts), so the output has every line exactly once. See runtime/extract.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from pydantic import Field

from prefect_gliner2.flows.prefect_compat import interrupts_surface
from prefect_gliner2.runtime.extract import ExtractSettings, prepare_job
from prefect_gliner2.tasks.extract import commit_extraction, extract_chunk

__all__ = ["extract_flow"]


@flow(name="gliner2-extract", persist_result=False)
def extract_flow(
    model_name: str,
    registry_root: str,
    data: str,
    out: str,
    version: str | None = None,
    labels: list[str] | None = None,
    threshold: Annotated[float, Field(ge=0, le=1)] | None = None,
    batch_size: Annotated[int, Field(ge=1)] = 8,
    records_per_task: Annotated[int, Field(ge=1)] = 256,
    chunk_size: Annotated[int, Field(ge=1)] = 384,
    chunk_overlap: Annotated[int, Field(ge=0)] = 64,
    output_format: Literal["jsonl", "label-studio", "spacy", "conll", "doccano", "spacy-jsonl"] = "jsonl",
    runtime: Literal["torch", "onnx"] = "torch",
    precision: Literal["fp32", "fp16", "int8"] | None = None,
) -> dict[str, Any]:
    """Extract with a registered model from every record of `data` into `out`.

    Args:
        model_name: The model's name in the registry.
        registry_root: Local directory or fsspec URL of the model registry.
        data: JSONL path or fsspec URL; a record is {"text": ..., optional "labels", "schema", "id"}.
        out: Output JSONL path or URL, one line per record ({"line", "id", "extraction"}), published whole.
        version: A registered version such as "v000002" (default: the one CURRENT points at, pinned at the start).
        labels: Entity labels for records without their own (default: the labels the model records, if any).
        threshold: One threshold for every label (default: the thresholds fitted for the model, else 0.5).
        batch_size: Texts per inference batch.
        records_per_task: Records per chunk task (the unit of caching and resumption).
        chunk_size: Texts longer than this many words are split into overlapping windows (gliner2's chunking).
        chunk_overlap: Words shared by adjacent windows.
        output_format: jsonl, or an annotation format to review the predictions in: label-studio (pre-annotations
            with scores and the model version), spacy (DocBin), conll, doccano or spacy-jsonl.
        runtime: "torch" (gliner2 on the torch model) or "onnx" (the version's ONNX export, through gliner2-onnx;
            its lineage names it: ``prefect-gliner2 export --format onnx`` or the training flow's ONNX step).
        precision: The ONNX export's precision (default: its first of fp32, int8, fp16); only with runtime "onnx".
    """
    with interrupts_surface():
        logger = get_run_logger()
        reference = f"{registry_root.rstrip('/')}/{model_name}" + (f"@{version}" if version else "")
        settings = ExtractSettings(
            labels=labels,
            threshold=threshold,
            batch_size=batch_size,
            records_per_chunk=records_per_task,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            output_format=output_format,
            runtime=runtime,
            precision=precision,
        )
        job = prepare_job(reference, data, out, settings)
        if job.committed is not None:
            logger.info("%s is already complete (%d line(s)); nothing to do", job.out, job.committed["records"])
            return {**job.committed, "already_committed": True}
        logger.info(
            "extracting %d record(s) in %d chunk task(s) with %s (%s%s); threshold %s",
            job.input.records,
            job.input.chunks,
            job.model.describe(),
            job.settings.runtime,
            f" {job.settings.precision}: {job.model.uri}" if job.settings.precision else "",
            job.threshold_source,
        )
        records = []
        for index in range(job.input.chunks):
            state = extract_chunk(job.work, job.key, index, return_state=True)
            info = dict(state.result())
            info["reused"] = bool(info["reused"]) or state.name == "Cached"
            records.append(info)
        summary: dict[str, Any] = commit_extraction(job.work, job.key, records)
        return summary
