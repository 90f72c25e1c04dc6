"""Resource bounds of one run: the worker's CPU thread budget, checkpoint retention, and disk used.

CPU threads (the default of ``cpu_threads``, recorded with the run on first use because the count changes the
bits) follow one rule: one run is one worker *slot*, and a slot gets its share of the CPUs this process may use,
never more.

1. ``$PREFECT_GLINER2_CPU_THREADS`` when set (a work pool's job variables can give each slot its budget);
2. else ``$OMP_NUM_THREADS`` when set (the usual per-process thread budget);
3. else the usable CPUs divided by the slots on this host, ``$PREFECT_GLINER2_WORKER_SLOTS`` (default 1; set it to
   the worker's ``--limit``), at least 1. Usable CPUs are the process's CPU affinity, capped by a cgroup CPU quota
   (containers, Kubernetes CPU limits).

Retention (``keep_checkpoints=N``): after a checkpoint is committed and the durable cursor has moved to it, older
checkpoints are pruned down to the newest N plus the checkpoint taken at the best validation step; the checkpoint
the cursor names is never touched. A checkpoint is deleted index first (from then on it is not a checkpoint,
only debris), then its files; a kill in between leaves an index-less directory that the next prune removes.

Blobs (``checkpoints/blobs/``: best weights, content-addressed, written by the worker *before* the index of the
checkpoint that refers to them) are kept while referenced: after the checkpoints are pruned, a blob is deleted when
no remaining committed checkpoint refers to it *and* it is older than the newest committed checkpoint's index.
The worker writes one checkpoint at a time, so a blob written for a checkpoint whose index is not committed yet
(pipelined operations may be writing it while the flow prunes) is never older than the newest committed index:
it is kept, as is a blob that checkpoint reuses (the newest committed checkpoint, never pruned, refers to it).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.rundir import RunDirectory, checkpoint_position
from prefect_gliner2.session_core.layout import BLOB_DIR, CHECKPOINTS_DIR
from prefect_gliner2.session_core.layout import CHECKPOINT_INDEX_FILE as INDEX_FILE
from prefect_gliner2.session_core.storage import is_local

__all__ = [
    "ENV_CPU_THREADS",
    "ENV_WORKER_SLOTS",
    "default_cpu_threads",
    "disk_used",
    "prune_blobs",
    "prune_checkpoints",
    "usable_cpus",
]

ENV_CPU_THREADS = "PREFECT_GLINER2_CPU_THREADS"
ENV_WORKER_SLOTS = "PREFECT_GLINER2_WORKER_SLOTS"

logger = logging.getLogger(__name__)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2/v1 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, int(quota)))
    return max(1, count)


def _cgroup_cpu_quota() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as handle:
            limit, period = handle.read().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as q, open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as p:
            limit_us, period_us = int(q.read()), int(p.read())
        return None if limit_us <= 0 else limit_us / period_us
    except (OSError, ValueError):
        return None


def _positive_env(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        from prefect_gliner2.session_core.errors import ConfigError

        raise ConfigError(f"${name}={raw!r} is not a positive integer; set it to a whole number >= 1 or unset it")
    return value


def default_cpu_threads() -> int:
    """Torch threads for one worker slot (see the module docstring for the rule)."""
    for name in (ENV_CPU_THREADS, "OMP_NUM_THREADS"):
        value = _positive_env(name)
        if value is not None:
            return value
    slots = _positive_env(ENV_WORKER_SLOTS) or 1
    return max(1, usable_cpus() // slots)


# ---- retention -------------------------------------------------------------------------------------------------


def prune_checkpoints(run_dir: RunDirectory, keep: int | None, *, best_step: int | None) -> list[str]:
    """Delete checkpoints beyond the newest `keep` (plus the best one and the cursor's); None keeps all.

    Call only while holding the lease and after the cursor committed the newest checkpoint. Returns the names
    removed (including index-less leftovers of an interrupted prune that lie before the cursor)."""
    cursor = run_dir.read_cursor()
    if keep is None or cursor is None:
        return []
    committed = run_dir.committed_checkpoints()
    protected = set(committed[-keep:]) | {cursor.checkpoint}
    protected |= {name for name in committed if best_step is not None and checkpoint_position(name)[0] == best_step}
    removed = []
    for name in committed:
        if name not in protected and checkpoint_position(name)[1] < cursor.cursor:
            _delete_checkpoint(run_dir, name)
            removed.append(name)
    return removed + run_dir.remove_half_pruned()


def _delete_checkpoint(run_dir: RunDirectory, name: str) -> None:
    folder = f"{run_dir.path}/{CHECKPOINTS_DIR}/{name}"
    run_dir.fs.rm(f"{folder}/{INDEX_FILE}")  # from here on it is no checkpoint, only debris
    faults.hit("prune", checkpoint_position(name)[1])
    run_dir.fs.rm(folder, recursive=True)


def prune_blobs(run_dir: RunDirectory) -> list[str]:
    """Delete blobs no committed checkpoint refers to that are older than the newest committed index (see the
    module docstring); returns their names. Call only while holding the lease, after `prune_checkpoints`. When an
    index cannot be read the references are unknown and nothing is deleted (logged)."""
    from prefect_gliner2.session_core.checkpoint import checkpoint_refs, is_blob_name
    from prefect_gliner2.session_core.errors import CheckpointError

    fs = run_dir.fs
    store = f"{run_dir.path}/{CHECKPOINTS_DIR}/{BLOB_DIR}"
    committed = run_dir.committed_checkpoints()  # one listing: the references and the newest index agree
    if not committed or not fs.exists(store):
        return []
    try:
        referenced = {
            ref.path.rsplit("/", 1)[-1] for name in committed for ref in checkpoint_refs(run_dir.checkpoint_uri(name))
        }
    except CheckpointError as exc:
        logger.warning("blobs not pruned: %s", exc)
        return []
    newest_index = fs.modified(f"{run_dir.path}/{CHECKPOINTS_DIR}/{committed[-1]}/{INDEX_FILE}")
    fs.invalidate_cache(store)
    removed = []
    for entry in fs.ls(store, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not is_blob_name(name) or name in referenced:
            continue
        path = f"{store}/{name}"
        if fs.modified(path) < newest_index:
            fs.rm(path)
            removed.append(f"{BLOB_DIR}/{name}")
    return removed


def disk_used(run_dir: RunDirectory) -> dict[str, Any]:
    """Bytes stored under the run directory, and under its checkpoints/ folder (on local storage a file linked
    under two names, e.g. an export sharing its last checkpoint's weights, counts once)."""
    fs = run_dir.fs
    total = _bytes_under(fs, run_dir.path)
    checkpoints = _bytes_under(fs, f"{run_dir.path}/{CHECKPOINTS_DIR}")
    return {
        "disk_bytes": total,
        "checkpoint_bytes": checkpoints,
        "checkpoints_kept": len(run_dir.committed_checkpoints()),
    }


def _bytes_under(fs: Any, path: str) -> int:
    if not fs.exists(path):
        return 0
    if not is_local(fs):
        return int(fs.du(path))
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # removed meanwhile (retention)
                continue
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total
