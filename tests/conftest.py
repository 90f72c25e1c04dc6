"""Test-wide settings (everything offline, quiet tokenizers, Prefect pointed at a throwaway home) and fixtures.

Shared helpers live in the ``support`` package (tests/support/); the one session-scoped Prefect server is the
``prefect_server`` fixture below, used by every module that runs flows. The real services some tests need (an S3
API server, PostgreSQL) are fixtures from ``support.services``, registered here: ``s3_endpoint``, ``s3_bucket``,
``postgres_url``.

The files run heaviest first (``HEAVIEST_FIRST``): ``make test`` hands whole files to two processes (``--dist
loadfile``) in collection order, so the last files handed out are short ones and neither process is left running a
long file alone at the end.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from support.services import postgres_url, s3_bucket, s3_endpoint

__all__ = ["postgres_url", "prefect_server", "s3_bucket", "s3_endpoint"]  # fixtures

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_MADE_HERE: list[str] = []


def _scratch(name: str, prefix: str) -> None:
    """``$name`` to a new temporary directory unless set; a directory made here is removed when this process exits."""
    if name not in os.environ:
        os.environ[name] = tempfile.mkdtemp(prefix=prefix)
        _MADE_HERE.append(os.environ[name])


atexit.register(lambda: [shutil.rmtree(path, ignore_errors=True) for path in _MADE_HERE])
_scratch("PREFECT_HOME", "prefect-home-")
# One intra-op thread everywhere (this process and every child it spawns): faster on 2 cores, and the thread
# count is part of a checkpoint's compatibility, so parents and children must agree.
os.environ.setdefault("OMP_NUM_THREADS", "1")
_scratch("PREFECT_GLINER2_CACHE", "prefect-gliner2-cache-")


# The costliest files, heaviest first: CPU seconds of each file's processes in one `make test` (2 cores, tests/
# support's profile of 2026-06-09), rounded: chaos 136, retrain 102, worker 96, cli 89, flow 88, interrupts 85,
# background_checkpoints 73, flow_crash 64, deployments 60, object_storage 48, ... The other files follow in their
# usual order (most take a few seconds).
HEAVIEST_FIRST = (
    "test_chaos.py",
    "test_retrain.py",
    "test_worker.py",
    "test_cli.py",
    "test_flow.py",
    "test_interrupts.py",
    "test_background_checkpoints.py",
    "test_flow_crash.py",
    "test_deployments.py",
    "test_object_storage.py",
    "test_params.py",
    "test_auto_grain.py",
    "test_ui_state.py",
    "test_managed_training_session.py",
    "test_model_init.py",
    "test_training_session.py",
    "test_mlflow.py",
    "test_resume_reads_once.py",
    "test_extract.py",
    "test_curves.py",
    "test_bad_inputs_flow.py",
    "test_events.py",
    "test_signal_in_task_creation.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's --dist loadfile hands out files with the most tests first unless told to keep this order
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest files first (``HEAVIEST_FIRST``), the others after them in collection order."""
    rank = {name: index for index, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: tests keep their order in a file


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One local Prefect test server for the whole pytest process (started on first use); yields its API URL."""
    from support.prefect_harness import local_prefect_server

    with local_prefect_server() as url:
        yield url
