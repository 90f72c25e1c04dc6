"""Resource bounds: the default CPU thread budget of a worker slot (never all CPUs for each of several runs); blobs
kept while a checkpoint refers to them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.runtime import resources
from prefect_gliner2.session_core.errors import ConfigError


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (resources.ENV_CPU_THREADS, resources.ENV_WORKER_SLOTS, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(resources, "usable_cpus", lambda: 8)
    return monkeypatch


def test_a_slot_gets_its_share_of_the_usable_cpus(clean_env: pytest.MonkeyPatch) -> None:
    assert resources.default_cpu_threads() == 8  # one slot on this host: all usable CPUs
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "4")
    assert resources.default_cpu_threads() == 2  # four runs at once: 4 x 2 threads on 8 CPUs, no oversubscription
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "16")
    assert resources.default_cpu_threads() == 1  # never below one thread


def test_explicit_budgets_come_first(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(resources.ENV_WORKER_SLOTS, "4")
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert resources.default_cpu_threads() == 3
    clean_env.setenv(resources.ENV_CPU_THREADS, "5")
    assert resources.default_cpu_threads() == 5


@pytest.mark.parametrize("raw", ["0", "-2", "two"])
def test_a_bad_budget_is_named(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    clean_env.setenv(resources.ENV_WORKER_SLOTS, raw)
    with pytest.raises(ConfigError, match=f"PREFECT_GLINER2_WORKER_SLOTS={raw!r} is not a positive integer"):
        resources.default_cpu_threads()


def test_usable_cpus_respects_the_affinity_mask() -> None:
    import os

    assert 1 <= resources.usable_cpus() <= len(os.sched_getaffinity(0))


# ---- blobs: kept while referenced ------------------------------------------------------------------------------


def _blob_run(tmp_path: Any) -> Any:
    from prefect_gliner2.runtime.rundir import RunDirectory

    run_dir = RunDirectory(str(tmp_path), "r")
    run_dir.create()
    return run_dir


def _commit(run_dir: Any, name: str, cursor: int, blob: Any) -> None:
    from prefect_gliner2.runtime.rundir import DurableCursor, checkpoint_position
    from prefect_gliner2.session_core.checkpoint import write_checkpoint

    meta = {"kind": "managed", "plan_fingerprint": "fp", "cursor": cursor, "step": checkpoint_position(name)[0]}
    write_checkpoint(run_dir.checkpoint_uri(name), {"managed.json": b"{}"}, meta, {"best.safetensors": blob})
    run_dir.commit_cursor(DurableCursor(name, cursor, checkpoint_position(name)[0], 0, False, "fp"))
    time.sleep(0.05)  # file times are coarse (a few ms): keep each write in its own tick


def _blob(run_dir: Any, data: bytes) -> Any:
    from prefect_gliner2.session_core.checkpoint import store_blob

    ref = store_blob(run_dir.checkpoint_uri("step-000009-batch-000099"), data, "safetensors")
    time.sleep(0.05)
    return ref


def name(ref: Any) -> str:
    return str(ref.path.rsplit("/", 1)[-1])


def _stored(run_dir: Any) -> set[str]:
    return {p.name for p in (Path(run_dir.path) / "checkpoints" / "blobs").iterdir()}


def test_blobs_are_kept_while_referenced_and_a_pending_one_survives(tmp_path: Any) -> None:
    from prefect_gliner2.session_core.checkpoint import open_checkpoint

    run_dir = _blob_run(tmp_path)
    old, shared = _blob(run_dir, b"best weights at step 1"), _blob(run_dir, b"best weights at step 2")
    _commit(run_dir, "step-000001-batch-000001", 2, old)
    _commit(run_dir, "step-000002-batch-000003", 4, shared)
    _commit(run_dir, "step-000003-batch-000005", 6, shared)  # the same best: referenced, not copied
    orphan = _blob(run_dir, b"written by a worker killed before its index")
    _commit(run_dir, "step-000004-batch-000007", 8, shared)
    pending = _blob(run_dir, b"best weights of the checkpoint being written now")  # its index not committed yet

    assert resources.prune_blobs(run_dir) == [f"blobs/{name(orphan)}"]  # older than the newest index, unreferenced
    assert _stored(run_dir) == {name(old), name(shared), name(pending)}  # every referenced one and the pending one
    assert resources.prune_checkpoints(run_dir, 1, best_step=None) == [
        "step-000001-batch-000001",
        "step-000002-batch-000003",
        "step-000003-batch-000005",
    ]
    assert resources.prune_blobs(run_dir) == [f"blobs/{name(old)}"]  # its only checkpoint is gone
    assert _stored(run_dir) == {name(shared), name(pending)}
    open_checkpoint(run_dir.checkpoint_uri("step-000004-batch-000007")).verify()  # the kept one is whole

    _commit(run_dir, "step-000005-batch-000009", 10, pending)  # the pending blob's checkpoint commits
    resources.prune_checkpoints(run_dir, 1, best_step=None)
    assert resources.prune_blobs(run_dir) == [f"blobs/{name(shared)}"]
    assert _stored(run_dir) == {name(pending)}
    open_checkpoint(run_dir.checkpoint_uri("step-000005-batch-000009")).verify()


def test_blobs_are_left_alone_when_an_index_is_unreadable(tmp_path: Any) -> None:
    run_dir = _blob_run(tmp_path)
    first = _blob(run_dir, b"one")
    _commit(run_dir, "step-000001-batch-000001", 2, first)
    unreferenced = _blob(run_dir, b"two")
    _commit(run_dir, "step-000002-batch-000003", 4, first)
    (Path(run_dir.path) / "checkpoints" / "step-000001-batch-000001" / "checkpoint.json").write_text("{damaged")
    assert resources.prune_blobs(run_dir) == []  # references unknown: nothing deleted
    assert unreferenced.path.rsplit("/", 1)[-1] in _stored(run_dir)
