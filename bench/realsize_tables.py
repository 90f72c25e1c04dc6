"""The tables `bench/realsize.py` prints from its rows (one dict per architecture): ratios as median (min-max) of
interleaved pairs, beside the seconds they come from."""

from __future__ import annotations

from typing import Any


def spread(row: dict[str, Any], key: str) -> str:
    """'median (min-max)' of a figure measured several times; the median alone when measured once."""
    values = row.get(f"{key}_all") or [row[key]]
    text = f"{row[key]:.2f}"
    return text if len(values) == 1 else f"{text} ({min(values):.2f}-{max(values):.2f})"


def print_all(rows: list[dict[str, Any]]) -> None:
    print(f"{'arch':9} {'params M':>8} {'native s':>8} {'session s':>9} {'step ratio':>10} {'ckpt GB':>7}")
    for r in rows:
        print(
            f"{r['arch']:9} {r['parameters'] / 1e6:8.1f} {r['native_step_s']:8.2f} {r['session_step_s']:9.2f} "
            f"{r['step_ratio']:10.3f} {r['checkpoint_bytes'] / 1e9:7.2f}"
        )
    print(
        f"\n{'arch':9} {'save/raw write':>18} {'load/raw read':>18} {'resume/fresh':>18} {'save +RAM':>9} "
        f"{'load +RAM':>9} {'bg vs block':>11}"
    )
    for r in rows:
        print(
            f"{r['arch']:9} {spread(r, 'save_ratio'):>18} {spread(r, 'load_ratio'):>18} "
            f"{spread(r, 'resume_ratio'):>18} {r['save_extra_rss']:8.2f}x {r['load_extra_rss']:8.2f}x "
            f"{_overlap_cell(r):>11}"
        )
    print("ratios: median (min-max) of interleaved pairs; targets: save <= 1.2, load <= 2, resume <= 1.2")
    for r in rows:
        if "final_save_ratio" in r:
            print(
                f"{r['arch']:9} a finished run's checkpoint (written around the page cache) vs the raw write+fsync: "
                f"{spread(r, 'final_save_ratio')} ({spread(r, 'final_save_s')} s)"
            )
    print_load_detail(rows)
    print(
        f"\n{'arch':9} {'save s':>17} {'raw w s':>17} {'load s':>17} {'raw r s':>17} {'index s':>7} {'verify s':>8} "
        f"{'fresh s':>17} {'resume s':>17}"
    )
    for r in rows:
        print(
            f"{r['arch']:9} {spread(r, 'save_s'):>17} {spread(r, 'raw_write_s'):>17} {spread(r, 'load_s'):>17} "
            f"{spread(r, 'raw_read_s'):>17} {r['index_check_s']:7.3f} {r['verify_s']:8.2f} "
            f"{spread(r, 'fresh_start_s'):>17} {spread(r, 'resume_s'):>17}"
        )
    print(
        f"\n{'arch':9} {'step s':>7} {'block lost s':>12} {'bg lost s':>9} {'snapshot s':>10} {'bg write s':>10} "
        f"{'bg steps':>8}"
    )
    for r in rows:
        if "overlap_bg_lost_s" in r:
            print(
                f"{r['arch']:9} {r['overlap_step_s']:7.2f} {r['overlap_sync_lost_s']:12.2f} "
                f"{r['overlap_bg_lost_s']:9.2f} {r['overlap_snapshot_s']:10.2f} {r['overlap_bg_write_s']:10.2f} "
                f"{r['overlap_bg_steps']:8.0f}"
            )
    print("bg vs block: training time lost per checkpoint, background / synchronous write (bench/overlap.py)")
    print_disk_read(rows)
    print_worker_resume(rows)
    print_flow_side(rows)


def print_load_detail(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        print(
            f"{r['arch']:9} load vs a raw read into fresh memory (first touch of every page): "
            f"{spread(r, 'load_fresh_ratio')} ({spread(r, 'raw_read_fresh_s')} s)"
        )
        if "load_cold_ratio" in r:
            print(
                f"{r['arch']:9} from the disk (the checkpoint out of the page cache before each): load "
                f"{spread(r, 'load_cold_s')} s vs raw read {spread(r, 'raw_read_cold_s')} s, "
                f"{spread(r, 'load_cold_ratio')}; target <= 2"
            )


def print_load(rows: list[dict[str, Any]]) -> None:
    """`--load-only`: the checkpoint's size and its loads against raw reads, from the page cache and the disk."""
    for r in rows:
        print(
            f"{r['arch']:9} {r['checkpoint_bytes'] / 1e9:.2f} GB: load {spread(r, 'load_s')} s vs raw read "
            f"{spread(r, 'raw_read_s')} s from the page cache, {spread(r, 'load_ratio')}; target <= 2"
        )
    print_load_detail(rows)


def _overlap_cell(row: dict[str, Any]) -> str:
    return f"{row['overlap_bg_vs_sync']:.2f}" if "overlap_bg_vs_sync" in row else "skipped"


#: The worker resume rows: key prefix and what the checkpoint holds.
WORKER_CASES = (
    ("worker_step", "step", "at a step boundary (every checkpoint of a run without gradient accumulation)"),
    ("worker", "mid", "mid-window (the pending gradients of an unfinished accumulation window too)"),
)


def print_worker_resume(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'arch':9} {'ckpt':5} {'worker fresh s':>17} {'worker resume s':>17} {'resume/fresh':>18} "
        f"{'of it load s':>17} {'batch s fresh':>17} {'batch s resume':>17}"
    )
    for prefix, case, _ in WORKER_CASES:
        for r in rows:
            if f"{prefix}_fresh_s" not in r:
                continue
            print(
                f"{r['arch']:9} {case:5} {spread(r, f'{prefix}_fresh_s'):>17} {spread(r, f'{prefix}_resume_s'):>17} "
                f"{spread(r, f'{prefix}_resume_ratio'):>18} {spread(r, f'{prefix}_load_s'):>17} "
                f"{spread(r, f'{prefix}_fresh_batch_s'):>17} {spread(r, f'{prefix}_resume_batch_s'):>17}"
            )
    print(
        "worker: each start a fresh interpreter with the worker's environment (its memory setting), timed from after "
        "its imports to the first batch done; a resume reads the checkpoint's state files while it builds the model "
        "(as a spare worker does, which imported before its run arrived); target resume/fresh <= 1.2"
    )
    for prefix, case, meaning in WORKER_CASES:
        print(f"ckpt {case}: {meaning}")
        for r in rows:
            if f"{prefix}_fresh_s" not in r:
                continue
            print(
                f"{r['arch']:9} {case:5} to the first optimizer update (a fresh start allocates its AdamW moments "
                f"there, a resume in its load): {spread(r, f'{prefix}_resume_update_s')} s vs "
                f"{spread(r, f'{prefix}_fresh_update_s')} s, {spread(r, f'{prefix}_update_ratio')}"
            )
            if f"{prefix}_spawned_ratio" in r:
                print(
                    f"{r['arch']:9} {case:5} a worker spawned for its run (its checkpoint read from before "
                    f"transformers and gliner2 are imported), from its start: {spread(r, f'{prefix}_spawned_s')} s vs "
                    f"{spread(r, f'{prefix}_fresh_from_start_s')} s, {spread(r, f'{prefix}_spawned_ratio')} to the "
                    f"first batch (the load after the build {spread(r, f'{prefix}_spawned_load_s')} s), "
                    f"{spread(r, f'{prefix}_spawned_update_ratio')} to the first update"
                )
            if f"{prefix}_kept_resume_ratio" in r:
                print(
                    f"{r['arch']:9} {case:5} the same resume keeping the checkpoint in the page cache (as restores did "
                    f"before they dropped it): to the first batch {spread(r, f'{prefix}_kept_resume_ratio')} "
                    f"(its batch {spread(r, f'{prefix}_kept_resume_batch_s')} s), to the first update "
                    f"{spread(r, f'{prefix}_kept_update_ratio')}"
                )


def print_disk_read(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if "disk_read_s" in r:
            print(
                f"{r['arch']:9} raw read of the checkpoint out of the page cache (from the disk, what a second restore "
                f"from it reads): {r['disk_read_s']:.2f} s, {r['checkpoint_bytes'] / 1e9 / r['disk_read_s']:.2f} GB/s"
            )


def print_flow_side(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'arch':9} {'flow RSS MB':>11} {'of it resume MB':>15} {'flow side s':>11}")
    for r in rows:
        print(f"{r['arch']:9} {r['flow_rss_mb']:11.0f} {r['flow_resume_extra_mb']:15.1f} {r['flow_side_s']:11.3f}")
    print("flow RSS: peak (VmHWM) of a process with a flow's imports doing a resume's flow side; target < 300 MB")


def print_resume(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'arch':9} {'params M':>8} {'ckpt GB':>7} {'index s':>7} {'verify s':>8} {'fresh s':>17} {'resume s':>17} "
        f"{'resume/fresh':>18}"
    )
    for r in rows:
        print(
            f"{r['arch']:9} {r['parameters'] / 1e6:8.1f} {r['checkpoint_bytes'] / 1e9:7.2f} {r['index_check_s']:7.3f} "
            f"{r['verify_s']:8.2f} {spread(r, 'fresh_start_s'):>17} {spread(r, 'resume_s'):>17} "
            f"{spread(r, 'resume_ratio'):>18}"
        )
    print("index s: the flow process's damage check now; verify s: the full verification it did before (not run)")
    print_disk_read(rows)
    print_worker_resume(rows)
    print_flow_side(rows)
