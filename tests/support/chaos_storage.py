"""The chaos engine's storage faults: damaged checkpoints (truncated, one bit edited, a file missing), a write that
fails before its commit, and a full disk (EFBIG mid-run): each must be detected and the run must continue exactly
from the previous intact checkpoint, or stop saying what to do (``storage_faults``; run by ``support.chaos``)."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

from prefect_gliner2.runtime.faults import Fault, FaultPlan

from support.chaos import CHECKPOINT_EVERY, THREADS, compare_exports, read_cursor, run_in_process, spawn, wait_for
from support.config import training_config

__all__ = ["FaultResult", "storage_faults"]


@dataclass
class FaultResult:
    fault: str
    detected: bool
    error: str
    continued_exactly: bool | None
    note: str


def _staged_run(finished: Path, target: Path, checkpoint: str) -> None:
    """What a crash right after committing `checkpoint` leaves: later checkpoints, export and final cursor gone."""
    shutil.copytree(finished, target)
    shutil.rmtree(target / "export", ignore_errors=True)
    names = sorted(p.name for p in (target / "checkpoints").iterdir() if p.name.startswith("step-"))
    for name in names[names.index(checkpoint) + 1 :]:
        shutil.rmtree(target / "checkpoints" / name)
    from prefect_gliner2.session_core.checkpoint import read_checkpoint

    meta = read_checkpoint(str(target / "checkpoints" / checkpoint)).meta
    cursor = json.loads((finished / "cursor.json").read_text())
    cursor.update(
        checkpoint=checkpoint,
        cursor=meta["cursor"],
        step=meta.get("step", int(checkpoint[5:11])),
        finished=False,
        export=None,
        summary=None,
    )
    cursor["epoch"] = meta.get("epoch", cursor["epoch"])
    (target / "cursor.json").write_text(json.dumps(cursor, sort_keys=True, indent=1))
    with contextlib.suppress(FileNotFoundError):
        (target / ".lease").unlink()


def storage_faults(root: Path, inputs: dict[str, str], api_url: str) -> list[FaultResult]:
    from prefect_gliner2.session_core import layout

    storage = root / "faults"
    base = dict(
        model="tiny:span",
        train_data=inputs["train"],
        valid_data=inputs["valid"],
        config=training_config(),
        storage=str(storage),
        # the faults below pick checkpoints of the reference run by position: keep them all
        checkpointing={"checkpoint_every": CHECKPOINT_EVERY, "keep_checkpoints": None},
        execution={"cpu_threads": THREADS},
    )
    reference = run_in_process({**base, "run_key": "reference"})
    finished = storage / "reference"
    newest = sorted(p.name for p in (finished / "checkpoints").iterdir() if layout.parse_checkpoint_name(p.name))[-2]
    results: list[FaultResult] = []

    def damage_truncate(ckpt: Path) -> None:
        target = max((p for p in ckpt.iterdir() if p.name != "checkpoint.json"), key=lambda p: p.stat().st_size)
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])

    def damage_edit(ckpt: Path) -> None:
        target = max((p for p in ckpt.iterdir() if p.name != "checkpoint.json"), key=lambda p: p.stat().st_size)
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))

    def damage_missing(ckpt: Path) -> None:
        (ckpt / "managed.json").unlink()

    for key, fault, damage in (
        ("truncated", "truncated checkpoint file", damage_truncate),
        ("edited", "one bit edited in a checkpoint file", damage_edit),
        ("missing", "checkpoint file missing", damage_missing),
    ):
        _staged_run(finished, storage / key, newest)
        damage(storage / key / "checkpoints" / newest)
        try:
            summary = run_in_process({**base, "run_key": key})
        except Exception as exc:  # noqa: BLE001 - the outcome is what we report
            detected = type(exc).__name__ == "CheckpointError"
            results.append(
                FaultResult(
                    fault,
                    detected,
                    f"{type(exc).__name__}: {str(exc)[:300]}",
                    False,
                    "resume refuses the damaged newest checkpoint and stops; it does not fall back "
                    "to the previous good checkpoint (product change proposed)",
                )
            )
            continue
        bits = compare_exports(summary["export"], reference["export"])[2]
        quarantined = sorted(
            p.name
            for p in (storage / key / layout.CHECKPOINTS_DIR).iterdir()
            if p.name.startswith(layout.DAMAGED_PREFIX)
        )
        note = (
            f"damaged checkpoint moved aside ({quarantined[0]}); continued from the previous intact checkpoint"
            if quarantined
            else f"resume did not notice the damage (resumed from batch {summary.get('resumed_from_batch')})"
        )
        results.append(FaultResult(fault, bool(quarantined), "", bits == 0, note))

    # An injected failure after the checkpoint's files are written, before the commit (the worker raises once).
    key = "failing-write"
    flag = root / "raise-once"
    summary = run_in_process({**base, "run_key": key}, FaultPlan((Fault.fail("checkpoint-write", 7, once=str(flag)),)))
    bits = compare_exports(summary["export"], reference["export"])[2]
    debris = [p.name for p in (storage / key / layout.CHECKPOINTS_DIR).iterdir() if layout.is_debris(p.name)]
    results.append(
        FaultResult(
            "checkpoint write fails before its commit (injected, once)",
            flag.exists(),
            "RuntimeError in the worker -> WorkerError (transient), task retried",
            bits == 0 and not debris,
            f"a fresh worker restored the previous checkpoint and replayed; {summary['worker_starts']} "
            "worker starts, no debris",
        )
    )

    # A real failing write in the middle of a run: once the first checkpoint is committed, prlimit(2) gives the
    # running flow process and its worker RLIMIT_FSIZE = 64 KiB, so the next checkpoint's files fail with EFBIG.
    key = "disk-full"
    checkpoints = sorted(p.name for p in (finished / "checkpoints").iterdir() if layout.parse_checkpoint_name(p.name))
    first = int(checkpoints[0].rsplit("-", 1)[1])  # (the blob store beside them is no checkpoint)
    after = first + 2  # a batch trained after the first checkpoint was committed (and its cursor written)
    markers = root / "markers-disk-full"
    markers.mkdir(parents=True, exist_ok=True)
    process = spawn(
        {**base, "run_key": key},
        FaultPlan((Fault.pause("batch", after, 3),), markers=str(markers)),
        api_url,
    )
    worker_pid = wait_for(markers, f"batch-{after}", process)
    limited = []
    for pid in (process.pid, worker_pid):
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
                limited.append(pid)
    output, _ = process.communicate(timeout=300)
    run = storage / key
    cursor = read_cursor(run)
    # Detected means reported as a permanent StorageFullError (EFBIG), not retried as if it were transient.
    efbig = "StorageFullError" in output and "EFBIG" in output
    committed = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    debris = [p.name for p in (run / layout.CHECKPOINTS_DIR).iterdir() if layout.is_debris(p.name)]
    summary = run_in_process({**base, "run_key": key})
    bits = compare_exports(summary["export"], reference["export"])[2]
    last_error = next(
        (line.strip() for line in reversed(output.splitlines()) if "StorageFullError" in line),
        next((line.strip() for line in reversed(output.splitlines()) if "Error" in line), ""),
    )
    results.append(
        FaultResult(
            "writes fail with EFBIG mid-run (RLIMIT_FSIZE 64 KiB set by prlimit after the first checkpoint)",
            process.returncode != 0 and efbig and len(limited) == 2,
            f"exit {process.returncode}: {last_error[:300]}",
            bits == 0 and bool(committed),
            f"the failed run kept {committed} (cursor at batch {cursor and cursor['cursor']}), "
            f"left {len(debris)} staging dir(s) for the next run to clean; the rerun without the "
            f"fault continued from batch {summary['resumed_from_batch']}",
        )
    )
    return results
