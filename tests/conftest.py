"""Test-wide settings (everything offline, quiet tokenizers, Prefect pointed at a throwaway home) and fixtures.

Shared helpers live in the ``support`` package (tests/support/); the one session-scoped Prefect server is the
``prefect_server`` fixture below, used by every module that runs flows. The real services some tests need (an S3
API server, PostgreSQL) are fixtures from ``support.services``, registered here: ``s3_endpoint``, ``s3_bucket``,
``postgres_url``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from support.services import postgres_url, s3_bucket, s3_endpoint

__all__ = ["postgres_url", "prefect_server", "s3_bucket", "s3_endpoint"]  # fixtures

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))
# One intra-op thread everywhere (this process and every child it spawns): faster on 2 cores, and the thread
# count is part of a checkpoint's compatibility, so parents and children must agree.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_GLINER2_CACHE", tempfile.mkdtemp(prefix="prefect-gliner2-cache-"))


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One local Prefect test server for the whole pytest process (started on first use); yields its API URL."""
    from support.prefect_harness import local_prefect_server

    with local_prefect_server() as url:
        yield url
