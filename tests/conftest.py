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


# The longest test files, longest first (seconds of one `make test` run, summed per file: `--durations=0`, then
# `python tests/file_times.py LOG`). `make test` runs `--dist loadfile --no-loadscope-reorder`: xdist hands whole
# files to its two processes in collection order, one at a time as each process frees up, so putting the long files
# first leaves the short ones to fill in at the end (longest processing time first) instead of one long file
# running alone while the other process idles. Files not listed keep their order, after these.
LONGEST_FILES = (
    "test_chaos.py",
    "test_retrain.py",
    "test_interrupts.py",
    "test_cli.py",
    "test_flow_crash.py",
    "test_background_checkpoints.py",
    "test_deployments.py",
    "test_worker.py",
    "test_object_storage.py",
    "test_flow.py",
    "test_ui_state.py",
    "test_mlflow.py",
    "test_auto_grain.py",
    "test_events.py",
    "test_curves.py",
    "test_model_init.py",
    "test_signal_in_task_creation.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order
