"""Preparing a run, before its lease: plan it (or load its manifest when it resumes without data), locate its run
directory, and, for a caller that plans before it starts a flow run, record a new run's manifest there and hand the
prepared run to that flow run in this process.

    prepared = prepare_run("tiny:span", "train.jsonl", "valid.jsonl", config, "ner-v1", "./runs")
    record_manifest(prepared)   # the CLI: the flow run then resumes run key ner-v1 from this manifest
    with handed_over(prepared):
        train_flow(model="tiny:span", run_key="ner-v1", storage="./runs")   # prepare_run answers with `prepared`

A run is planned once per process: a resume by run key alone that was handed over is answered with the plan in
memory (its manifest bytes go along, so the lease-holding ``open_run`` compares them with the recorded file instead
of decoding it); any other resume decodes the run directory's manifest. Torch-free and Prefect-free;
``runtime.run.open_run`` opens what this prepares.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.runtime.errors import RunConflictError
from prefect_gliner2.runtime.lease import DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT, RunLease
from prefect_gliner2.runtime.model_sources import model_architecture
from prefect_gliner2.runtime.rundir import RunDirectory, validate_run_key
from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, layout
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.manifest import encode_manifest

__all__ = ["STORAGE_ENV", "PreparedRun", "default_storage", "handed_over", "prepare_run", "record_manifest"]

STORAGE_ENV = "PREFECT_GLINER2_STORAGE"

logger = logging.getLogger(__name__)


def default_storage() -> str:
    """$PREFECT_GLINER2_STORAGE, else ~/.prefect-gliner2/runs."""
    return os.environ.get(STORAGE_ENV) or os.path.join(os.path.expanduser("~"), ".prefect-gliner2", "runs")


@dataclass
class PreparedRun:
    """A planned run and where it lives; nothing is written yet."""

    run_dir: RunDirectory
    plan: ManagedTrainingPlan
    manifest: bytes | None  # None: the run directory's own manifest is used (resume without data)
    content_address: str
    has_validation: bool
    model: str


def prepare_run(
    model: str,
    train_data: Any,
    valid_data: Any,
    config: TrainingConfig | None,
    run_key: str | None,
    storage: str | None,
) -> PreparedRun:
    """Plan the run (or load its manifest when no training data is given) and locate its run directory; a resume of
    a run handed over in this process (``handed_over``) is that run."""
    if run_key is not None:
        validate_run_key(run_key)
    storage = storage or default_storage()
    if train_data is None and run_key is not None:
        handed = _handed(model, run_key, storage)
        if handed is not None:
            _check_config(config, handed.plan.config, run_key)
            return handed
    architecture = model_architecture(model)
    if train_data is None:
        return _resumed(model, config, run_key, storage)
    if config is None:
        raise ConfigError("config is required for a new run: pass TrainingConfig fields (at least fp16 and bf16)")
    try:
        plan = ManagedTrainingPlan(train_data, config, architecture=architecture)
        manifest = encode_manifest(plan, valid_data)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"data file {exc.filename or exc} does not exist; pass JSONL path(s) or URL(s) that exist"
        ) from None
    address = manifest.content_address
    key = run_key if run_key is not None else f"{architecture}-{address[:16]}"
    run_dir = RunDirectory(storage, validate_run_key(key))
    return PreparedRun(run_dir, plan, manifest.data, address, manifest.eval_record_count > 0, model)


def _resumed(model: str, config: TrainingConfig | None, run_key: str | None, storage: str) -> PreparedRun:
    """A run resumed by its run key alone: its plan is the one its run directory's manifest records."""
    if run_key is None:
        raise ConfigError("train_data is required for a new run; to resume without it, pass the run_key")
    run_dir = RunDirectory(storage, run_key)
    if not run_dir.exists(layout.MANIFEST_FILE):
        raise ConfigError(
            f"run key {run_key!r} has no manifest at {run_dir.uri}; pass train_data and config to start it"
        )
    loaded = ManagedTrainingPlan.from_manifest(run_dir.manifest_uri)
    _check_config(config, loaded.plan.config, run_key)
    return PreparedRun(run_dir, loaded.plan, None, loaded.content_address, len(loaded.eval_records) > 0, model)


def _check_config(config: TrainingConfig | None, planned: TrainingConfig, run_key: str) -> None:
    if config is not None and config.to_dict() != planned.to_dict():
        raise RunConflictError(
            f"run key {run_key!r} was planned with a different config; omit config to resume "
            "with the recorded one, or use a new run key"
        )


#: run directory URI -> the run handed over for it (``handed_over``); this process only
_HANDED: dict[str, PreparedRun] = {}


@contextmanager
def handed_over(prepared: PreparedRun) -> Iterator[PreparedRun]:
    """For the block, a ``prepare_run`` in this process that resumes `prepared`'s run directory by its run key alone
    (no training data; the same model) returns `prepared` instead of decoding the manifest again. For a caller that
    recorded the manifest (``record_manifest``) and then starts the flow run on the run key: the CLI. A `prepared`
    that carries manifest bytes carries them on, so that ``open_run`` compares them with the recorded manifest under
    the lease (a different one is refused, as for a run given its data)."""
    uri = prepared.run_dir.uri
    previous = _HANDED.get(uri)
    _HANDED[uri] = prepared
    try:
        yield prepared
    finally:
        if previous is None:
            _HANDED.pop(uri, None)
        else:
            _HANDED[uri] = previous


def _handed(model: str, run_key: str, storage: str) -> PreparedRun | None:
    """The run handed over for this run directory and model whose manifest is still recorded, else None."""
    if not _HANDED:
        return None
    handed = _HANDED.get(RunDirectory(storage, run_key).uri)
    if handed is None or handed.model != model or not handed.run_dir.exists(layout.MANIFEST_FILE):
        return None  # prepared as if nothing was handed over (a missing manifest is refused there)
    return handed


def record_manifest(
    prepared: PreparedRun, *, lease_ttl: float = DEFAULT_LEASE_TTL, lease_wait: float = DEFAULT_LEASE_WAIT
) -> bool:
    """Put a newly planned run's manifest into its run directory, so that a flow run given only the run key resumes
    exactly this plan; True when it was written now. A run key that holds another plan is refused
    (RunConflictError) and nothing is written. The manifest is written once, under the run key's lease (two callers
    racing for a new run key cannot both write); an existing one is only compared (it never changes)."""
    if prepared.manifest is None:
        return False  # prepared from the run directory's own manifest
    run_dir = prepared.run_dir
    if run_dir.exists(layout.MANIFEST_FILE):
        run_dir.ensure_manifest(prepared.manifest)  # write-once: comparing needs no lease
        return False
    run_dir.create()
    with RunLease(run_dir, ttl=lease_ttl, wait=lease_wait):
        written = run_dir.ensure_manifest(prepared.manifest)
    if written:
        logger.info("new run %s: manifest written to %s", run_dir.run_key, run_dir.manifest_uri)
    return written
