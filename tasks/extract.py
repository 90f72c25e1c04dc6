"""Extraction tasks: compute one chunk of an extraction job, and publish the output. Cached and retry-safe.

A chunk task's cache key is ``sha256(job key, chunk index)``; the job key (runtime/extract.py) covers the input's
fingerprint, the model's identity, the thresholds, the schema, every setting that changes a line, and the nonce of
the job's work directory (a deleted work directory is a new job, never a stale cache hit). Below the cache, the
task itself is idempotent: a chunk whose part is committed is read back, not computed again, so a retry or a
rerun after a crash neither duplicates nor loses a line.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_gliner2.runtime.errors import retry_if_transient
from prefect_gliner2.runtime.extract import ExtractJob, commit_output, load_job, run_chunk
from prefect_gliner2.session_core.errors import ConfigError

__all__ = ["chunk_cache_key", "commit_extraction", "extract_chunk"]

RETRYING: dict[str, Any] = {"retries": 2, "retry_delay_seconds": 1.0, "retry_condition_fn": retry_if_transient}


def chunk_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    material = "\x1f".join(["prefect-gliner2/extract/v1", str(parameters["job_key"]), str(parameters["index"])])
    return hashlib.sha256(material.encode()).hexdigest()


def _job(work: str, job_key: str) -> ExtractJob:
    job = load_job(work)
    if job.key != job_key:
        raise ConfigError(f"{work} now holds another extraction job ({job.key[:12]} != {job_key[:12]}); run again")
    return job


@task(
    name="extract-chunk",
    task_run_name="chunk {index}",
    cache_key_fn=chunk_cache_key,
    cache_expiration=timedelta(days=7),
    persist_result=True,
    **RETRYING,
)
def extract_chunk(work: str, job_key: str, index: int) -> dict[str, Any]:
    """Extract chunk `index` of the job in `work` into its part (or read back the part a run before committed)."""
    info = run_chunk(_job(work, job_key), index)
    if not info["reused"]:
        get_run_logger().info(
            "chunk %d: %d record(s) in %.2f s, %d long text(s) chunked",
            index,
            info["records"],
            info["seconds"],
            info["texts_chunked"],
        )
    return info


@task(name="commit-extraction", cache_policy=NO_CACHE, **RETRYING)
def commit_extraction(work: str, job_key: str, chunk_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Publish the output (every part in order, atomically) and record the job's summary."""
    summary = commit_output(_job(work, job_key), chunk_records)
    get_run_logger().info("wrote %d line(s) to %s", summary["records"], summary["out"])
    return summary
