"""Real model size (the gliner2-base shape, built offline): step overhead, checkpoint I/O and resume, side by side.

    python bench/realsize.py [--arch span,boundary] [--steps 4] [--device cpu|cuda] [--bf16] [--json OUT] [--smoke]
                             [--resume-only | --load-only]

For each architecture a randomly initialised model of the gliner2-base shape (DeBERTa-v3-base encoder: hidden 768,
12 layers, the full 128,100-token vocabulary; `GLINER2_BASE_SIZE`) is built in code, and in one process:

- step ratio: the session's public `forward_backward` + `optim_step` against the same engine's native methods
  (`_backward_one` + `_optimizer_step`, what native `train()` calls per batch, with the session's guard hook
  detached), on the same model and the same collated batches, alternating step by step so that both see the same
  machine state; the median of the per-step ratios is printed.
- checkpoint bytes, save_state vs a raw write+fsync of the same number of bytes (and the same checkpoint written
  as a finished run's is, around the page cache: ``write_checkpoint(direct=True)``), load_state (into a fresh session)
  vs a raw read of the checkpoint's files into one reused buffer (the target's baseline) and into freshly allocated
  memory held until the end (the first touch of every page, which a load into a fresh session pays too), all from
  the page cache (each read once untimed first: a restore drops what it read from the cache), each pair interleaved
  `--repeats` times; and the extra peak RSS during each (above the larger of before/after, sampled every 5 ms)
  relative to the checkpoint size.
- resume: the flow process's damage check (`open_checkpoint`: the index and every file's size, no payload read),
  then a fresh session that loads the checkpoint (the worker's verified read, the only full read) and runs its first
  batch, against a fresh session that runs its first batch; the ratio of the two wall times. The page cache as each
  finds it in a run: a fresh start with no checkpoint cached, a resume with its own. Beside it, the seconds
  of the index check and of the full streamed verification the flow process did before (`read_checkpoint`), and a
  raw read of the checkpoint once it is out of the page cache (from the disk: what a second restore from the same
  checkpoint reads, since a restore drops what it read).
  `--resume-only` skips the step and load timings (a checkpoint is still written, as the resume needs one).
- load from the disk: the same load and raw read with the checkpoint dropped from the page cache before each
  (``posix_fadvise(DONTNEED)``): what loading a checkpoint written long before, or after a reboot, costs beside
  reading its bytes from the disk. `--load-only` measures the loads (both kinds) and nothing else.
- resume in a worker-like process: the same comparison in fresh interpreters started with the session worker's
  environment (``worker_environment``: its memory setting), each timed from after its imports (the same in both)
  through the session build, the verified load (resume only) and the first batch: what a restarted worker does,
  including its head start (``prefetch_state``: the state files read while the model is built). Beside each resume
  the same resume with the restore's page-cache drop disabled (how restores read before): side by side, what the
  drop does on this machine. And the resume of a worker spawned for its run (a restart within a run: it has its
  checkpoint once torch is imported and reads it while transformers and gliner2 load, ``runtime.worker_child``),
  timed from the process's start against a fresh start's whole start, imports included (the figures above are of
  a spare, which imported everything before its run arrived, timed after the imports). Twice: from a checkpoint
  at an optimizer-step boundary (every checkpoint of a run without gradient accumulation) and from the mid-window
  one (pending gradients too). The in-process figure above is the plain `load_state` (no head start) and reuses
  memory the previous sessions of this process freed; a worker never can.
- bg vs block: training seconds lost per checkpoint written in the background vs synchronously (bench/overlap.py's
  `checkpoint_overlap`, on a fresh session; `--overlap-rounds 0` skips it).
- flow-process RSS during a resume: `bench/flow_side_resume.py`, a separate process, imports what a flow process
  imports (`flows.train`: Prefect and the runtime), then runs the flow side of a resume on a run directory whose
  cursor names the real-size checkpoint (debris removal, the index-only damage check, the cursor read); its peak
  RSS (`VmHWM`) is printed, with the part added after the imports. Not a whole flow run: no Prefect server, no
  worker, no flow engine.
- hash speed: sha256 of one buffer in one thread (formats 2-3), BLAKE3 in one thread and as the checkpoints
  stream it over the hashing threads (format 4), beside a memcpy of the same bytes: what bounds save and load
  when the page cache makes raw I/O a memcpy.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from fresh_process import first_touch, uncache, worker_start  # noqa: E402  (bench/fresh_process.py, beside this script)
from overlap import bench_config, checkpoint_overlap  # noqa: E402  (bench/overlap.py, beside this script)
from realsize_tables import print_all, print_load, print_resume  # noqa: E402  (bench/realsize_tables.py, beside this script)

from prefect_gliner2.session_core.checkpoint import digest as checkpoint_digest  # noqa: E402
from prefect_gliner2.session_core.checkpoint import open_checkpoint, read_checkpoint, write_checkpoint  # noqa: E402
from prefect_gliner2.session_core.checkpoint.format import BLAKE3  # noqa: E402
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession  # noqa: E402
from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples this process's resident set size in a thread; `peak` is the largest seen while active."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * PAGE

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRss:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def new_session(model_dir: Path, cfg: TrainingConfig, plan: ManagedTrainingPlan, device: str) -> TrainingSession:
    from gliner2.auto import AutoExtractor

    return TrainingSession(AutoExtractor.from_pretrained(str(model_dir)), cfg, max_steps=plan.max_steps, device=device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step_ratio(session: TrainingSession, plan: ManagedTrainingPlan, steps: int, device: str) -> dict[str, float]:
    """Alternate a native step (engine methods, guard hook detached) and a session step on the same model."""
    engine = session.engine
    hooks = engine.optimizer._optimizer_step_pre_hooks  # the session's non-finite guard: detached for native steps

    def native(i: int) -> None:
        from prefect_gliner2.session_core.pairs import to_pairs
        from prefect_gliner2.training.engine import private_python_rng

        saved = dict(hooks)
        hooks.clear()
        try:
            with private_python_rng(engine.python_rng):
                batch = engine.train_collator(to_pairs(plan.batch(i)))
            engine._backward_one(batch, 0, engine.use_amp, engine.amp_dtype, is_last_micro=True)
            engine._optimizer_step()
            engine.global_step += 1
        finally:
            hooks.update(saved)

    def ours(i: int) -> None:
        session.forward_backward(plan.batch(i))
        session.optim_step()

    times: dict[str, list[float]] = {"native": [], "session": []}
    for i in range(2 * steps + 2):
        kind, run = (("native", native), ("session", ours))[i % 2]
        sync(device)
        started = time.perf_counter()
        run(i)
        sync(device)
        if i >= 2:  # the first of each kind warms up
            times[kind].append(time.perf_counter() - started)
    ratios = [s / n for n, s in zip(times["native"], times["session"], strict=True)]
    return {
        "native_step_s": statistics.median(times["native"]),
        "session_step_s": statistics.median(times["session"]),
        "step_ratio": statistics.median(ratios),
    }


def raw_io(size: int, tmp: str) -> tuple[float, float]:
    """Seconds to write+fsync and to read back `size` bytes (64 MiB buffer reused; no extra RAM)."""
    path = Path(tmp) / "raw.bin"
    block = os.urandom(64 << 20)
    started = time.perf_counter()
    with open(path, "wb") as handle:
        left = size
        while left > 0:
            left -= handle.write(memoryview(block)[: min(left, len(block))])
        handle.flush()
        os.fsync(handle.fileno())
    write = time.perf_counter() - started
    buffer = bytearray(8 << 20)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    read = time.perf_counter() - started
    path.unlink()
    return write, read


def final_save(session: TrainingSession, target: Path) -> None:
    """The same checkpoint written as a finished run's is (``ManagedTraining.write_prepared``): around the page
    cache (``session_core/direct_io.py``)."""
    files, meta = session.state_payload()
    write_checkpoint(str(target), files, meta, direct=True)


def cache(folder: Path) -> None:
    """Read every file in `folder` once, untimed: each timed read, load and resume here starts with the checkpoint in
    the page cache, as a resume after a kill finds its recently written checkpoint (a restore drops what it read from
    the cache, so without this the next repeat would read from the disk)."""
    raw_read(folder)


def cached_as_at_a_start(ckpt: Path, restore: bool) -> None:
    """The page cache as a start finds it: no checkpoint of this benchmark cached for a fresh start (a new run has
    none), only its own checkpoint for a resume (written shortly before the kill). Without this a fresh start would
    run beside gigabytes of this benchmark's checkpoints in the cache, which on a VM whose host backs only so much
    guest memory cheaply (see ``fresh_process.first_touch``) makes its own allocations dearer."""
    for folder in ckpt.parent.glob("ckpt-*"):
        uncache(folder)
    if restore:
        cache(ckpt)


def raw_read(folder: Path) -> float:
    """Seconds to read every file in `folder` into one reused 8 MiB buffer (no hashing, no fresh memory)."""
    buffer = bytearray(8 << 20)
    started = time.perf_counter()
    for path in sorted(folder.iterdir()):
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass
    return time.perf_counter() - started


def raw_read_fresh(folder: Path) -> float:
    """Seconds to read every file in `folder` into freshly allocated memory of its size, all of it held until the
    last file is read, as a load holds what it reads (what a load pays besides the copy: the first touch of every
    page the optimizer moments and gradients land in)."""
    held = []
    started = time.perf_counter()
    for path in sorted(folder.iterdir()):
        target = torch.empty(path.stat().st_size, dtype=torch.uint8)
        view = memoryview(target.numpy())
        with open(path, "rb", buffering=0) as handle:
            for start in range(0, len(view), 8 << 20):
                handle.readinto(view[start : start + (8 << 20)])
        held.append(target)
        del view
    seconds = time.perf_counter() - started
    del held
    return seconds


def timed(action: Callable[[], Any]) -> tuple[float, int, int, int]:
    gc.collect()
    before = PeakRss.now()
    with PeakRss() as rss:
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
    return seconds, before, rss.peak, PeakRss.now()


def measure(arch: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    built = time.perf_counter()
    shape = dict(GLINER2_BASE_SIZE)
    if args.smoke:  # the same code paths on a small DeBERTa-v3 (seconds): for checking the script itself
        shape.update(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=1000)
    model_dir = save_tiny_model(Path(tmp) / f"model-{arch}", arch, seed=0, dropout=0.1, **shape)
    cfg = bench_config(tmp, args.bf16)
    plan = ManagedTrainingPlan(tiny_records(4 * args.steps + 8, seed=3), cfg, architecture=arch)
    session = new_session(model_dir, cfg, plan, args.device)
    parameters = sum(p.numel() for p in session.model.parameters())
    row: dict[str, Any] = {"arch": arch, "parameters": parameters, "build_s": time.perf_counter() - built}
    row["load_average"] = round(os.getloadavg()[0], 2)
    if args.resume_only or args.load_only:  # one update: the checkpoint holds the AdamW moments as a real one does
        session.forward_backward(plan.batch(0))
        session.optim_step()
    else:
        row.update(step_ratio(session, plan, args.steps, args.device))
    progress(row)
    step_ckpt = Path(tmp) / f"ckpt-{arch}-step"  # at an optimizer-step boundary: every checkpoint of a default run
    session.save_state(str(step_ckpt))

    session.forward_backward(plan.batch(2 * args.steps + 2))  # mid-window: pending gradients are in the checkpoint
    ckpt = Path(tmp) / f"ckpt-{arch}"
    saves, final_saves, raw_writes = [], [], []
    for repeat in range(args.repeats):  # the same state saved again: save, final save and raw write interleaved
        target = ckpt if repeat == 0 else Path(tmp) / f"ckpt-{arch}-{repeat}"
        save_s, before, peak, after = timed(lambda target=target: session.save_state(str(target)))
        size = sum(f.stat().st_size for f in target.iterdir())
        saves.append(save_s)
        row.update(checkpoint_bytes=size, save_extra_rss=(peak - max(before, after)) / size)
        if repeat:
            shutil.rmtree(target)
        if not (args.resume_only or args.load_only):
            final = Path(tmp) / f"ckpt-{arch}-final-{repeat}"
            final_saves.append(timed(lambda final=final: final_save(session, final))[0])
            shutil.rmtree(final)
            raw_writes.append(raw_io(size, tmp)[0])
    row.update(figures("save_s", saves) | figures("raw_write_s", raw_writes))
    row.update(ratios("save_ratio", saves, raw_writes))
    if final_saves:
        row.update(figures("final_save_s", final_saves) | ratios("final_save_ratio", final_saves, raw_writes))
    session.close()  # drops the model and optimizer: the fresh session below is the only one alive
    gc.collect()

    if not args.resume_only:
        row.update(loads_vs_raw_reads(model_dir, cfg, plan, args, ckpt, size))
        progress(row)
        if args.load_only:
            shutil.rmtree(model_dir)
            return row
        if args.overlap_rounds:
            overlap = checkpoint_overlap(
                model_dir, arch, tmp, steps=args.steps, rounds=args.overlap_rounds, device=args.device, bf16=args.bf16
            )
            row.update({f"overlap_{key}": value for key, value in overlap.items()})
            progress(row)
            gc.collect()

    row.update(resume(model_dir, cfg, plan, args, ckpt))
    progress(row)
    row.update(resume_in_worker(model_dir, cfg, plan, args, ckpt))
    progress(row)
    row.update(resume_in_worker(model_dir, cfg, plan, args, step_ckpt, prefix="worker_step"))
    progress(row)
    shutil.rmtree(step_ckpt)
    row.update(flow_side_rss(ckpt, plan, tmp))
    progress(row)
    shutil.rmtree(model_dir)
    return row


def loads_vs_raw_reads(
    model_dir: Path, cfg: TrainingConfig, plan: ManagedTrainingPlan, args: argparse.Namespace, ckpt: Path, size: int
) -> dict[str, Any]:
    """`load_state` into a fresh session against raw reads of the checkpoint's own files, interleaved `--repeats`
    times: from the page cache (a raw read into one reused buffer, and one into fresh memory) and from the disk (the
    checkpoint dropped from the page cache before the raw read and before the load: what loading a checkpoint
    written long before, or after a reboot, reads)."""
    loads, raw_reads, fresh_reads, cold_loads, cold_reads = [], [], [], [], []
    out: dict[str, Any] = {}

    def load(cold: bool) -> float:
        session = new_session(model_dir, cfg, plan, args.device)
        gc.collect()
        if cold:
            uncache(ckpt)
        else:
            cache(ckpt)
        load_s, before, peak, after = timed(lambda: session.load_state(str(ckpt)))
        if not cold:
            out.update(load_extra_rss=(peak - max(before, after)) / size)
        session.close()
        return load_s

    for repeat in range(args.repeats):
        for cold in (False, True) if repeat % 2 == 0 else (True, False):
            if cold:
                uncache(ckpt)
                cold_reads.append(raw_read(ckpt))
                cold_loads.append(load(cold))
            else:
                cache(ckpt)
                raw_reads.append(raw_read(ckpt))
                fresh_reads.append(raw_read_fresh(ckpt))
                loads.append(load(cold))
            gc.collect()
    out.update(figures("load_s", loads) | figures("raw_read_s", raw_reads))
    out.update(figures("raw_read_fresh_s", fresh_reads) | ratios("load_ratio", loads, raw_reads))
    out.update(ratios("load_fresh_ratio", loads, fresh_reads))
    out.update(figures("load_cold_s", cold_loads) | figures("raw_read_cold_s", cold_reads))
    out.update(ratios("load_cold_ratio", cold_loads, cold_reads))
    return out


def progress(row: dict[str, Any]) -> None:
    """Figures as soon as they are known (stderr), so that a run cut short still reports what it measured."""
    print(json.dumps(row), file=sys.stderr, flush=True)


def resume(
    model_dir: Path, cfg: TrainingConfig, plan: ManagedTrainingPlan, args: argparse.Namespace, ckpt: Path
) -> dict[str, float]:
    batch = plan.batch(2 * args.steps + 3)

    def start(restore: bool) -> float:
        cached_as_at_a_start(ckpt, restore)
        started = time.perf_counter()
        if restore:
            open_checkpoint(str(ckpt), min_version=1)  # the flow process's damage check: index and sizes only
        session = new_session(model_dir, cfg, plan, args.device)
        if restore:
            session.load_state(str(ckpt))
        session.forward_backward(batch)
        sync(args.device)
        seconds = time.perf_counter() - started
        session.close()
        gc.collect()
        return seconds

    fresh, resumed = [], []
    for _ in range(args.repeats):  # interleaved: both see the same machine state
        fresh.append(start(False))
        resumed.append(start(True))
    index_s = timed(lambda: open_checkpoint(str(ckpt), min_version=1))[0]
    cache(ckpt)
    verify_s = timed(lambda: read_checkpoint(str(ckpt)))[0]  # what the flow process read before: for comparison
    cached_as_at_a_start(ckpt, restore=False)  # out of the page cache: what a second restore from it reads
    disk_read_s = raw_read(ckpt)
    return {
        **figures("fresh_start_s", fresh),
        **figures("resume_s", resumed),
        **ratios("resume_ratio", resumed, fresh),
        "index_check_s": index_s,
        "verify_s": verify_s,
        "disk_read_s": disk_read_s,
    }


def resume_in_worker(
    model_dir: Path,
    cfg: TrainingConfig,
    plan: ManagedTrainingPlan,
    args: argparse.Namespace,
    ckpt: Path,
    prefix: str = "worker",
) -> dict[str, Any]:
    """The resume as a worker does it: a fresh interpreter with the worker's environment (its memory setting)
    starts reading the checkpoint's state files in the background, builds the session meanwhile, loads the
    checkpoint and trains the first batch, against one that builds and trains the same batch; timed from after the
    imports (the same in both) to the batch done. Interleaved `--repeats`. Keys begin with `prefix`."""

    def start(restore: bool, keep_cache: bool = False, spawned: bool = False) -> dict[str, float]:
        cached_as_at_a_start(ckpt, restore)
        return worker_start(
            restore=str(ckpt) if restore else None,
            keep_cache=keep_cache,
            spawned=spawned,
            threads=torch.get_num_threads(),
            config=cfg.to_dict(),
            records=4 * args.steps + 8,
            arch=plan.architecture,
            model=str(model_dir),
            device=args.device,
            batch=2 * args.steps + 3,
        )

    fresh, resumed, kept, spawned = [], [], [], []
    variants = [(resumed, {}), (kept, {"keep_cache": True}), (spawned, {"spawned": True})]
    for repeat in range(args.repeats):  # the resumes take turns first, so none always follows the fresh start
        fresh.append(start(False))
        for out, how in variants[repeat % 3 :] + variants[: repeat % 3]:
            out.append(start(True, **how))
    return {
        **figures(f"{prefix}_fresh_from_start_s", [r["from_start"] for r in fresh]),
        **figures(f"{prefix}_spawned_s", [r["from_start"] for r in spawned]),
        **ratios(f"{prefix}_spawned_ratio", [r["from_start"] for r in spawned], [r["from_start"] for r in fresh]),
        **ratios(
            f"{prefix}_spawned_update_ratio",
            [r["update_from_start"] for r in spawned],
            [r["update_from_start"] for r in fresh],
        ),
        **figures(f"{prefix}_spawned_load_s", [r["load"] for r in spawned]),
        **figures(f"{prefix}_kept_resume_s", [r["total"] for r in kept]),
        **ratios(f"{prefix}_kept_resume_ratio", [r["total"] for r in kept], [r["total"] for r in fresh]),
        **figures(f"{prefix}_kept_resume_batch_s", [r["first_batch"] for r in kept]),
        **ratios(f"{prefix}_kept_update_ratio", [r["first_update"] for r in kept], [r["first_update"] for r in fresh]),
        **figures(f"{prefix}_fresh_s", [r["total"] for r in fresh]),
        **figures(f"{prefix}_resume_s", [r["total"] for r in resumed]),
        **ratios(f"{prefix}_resume_ratio", [r["total"] for r in resumed], [r["total"] for r in fresh]),
        **figures(f"{prefix}_load_s", [r["load"] for r in resumed]),
        **figures(f"{prefix}_fresh_batch_s", [r["first_batch"] for r in fresh]),
        **figures(f"{prefix}_resume_batch_s", [r["first_batch"] for r in resumed]),
        **ratios(f"{prefix}_update_ratio", [r["first_update"] for r in resumed], [r["first_update"] for r in fresh]),
        **figures(f"{prefix}_fresh_update_s", [r["first_update"] for r in fresh]),
        **figures(f"{prefix}_resume_update_s", [r["first_update"] for r in resumed]),
    }


def figures(key: str, values: list[float]) -> dict[str, Any]:
    """`key`: the median of `values`; `key`_all: every value (for the spread)."""
    return {key: statistics.median(values), f"{key}_all": list(values)} if values else {}


def ratios(key: str, numerators: list[float], denominators: list[float]) -> dict[str, Any]:
    """The ratio of each interleaved pair: `key` their median, `key`_all every one."""
    return figures(key, [n / d for n, d in zip(numerators, denominators, strict=False)])


def flow_side_rss(ckpt: Path, plan: ManagedTrainingPlan, tmp: str) -> dict[str, float]:
    """Peak RSS of a separate process doing the flow side of a resume from `ckpt` (moved into a run directory)."""
    from prefect_gliner2.runtime.rundir import DurableCursor, RunDirectory
    from prefect_gliner2.session_core import layout

    run_dir = RunDirectory(str(Path(tmp) / "runs"), "realsize")
    run_dir.create()
    name = layout.checkpoint_name(1, 1)
    os.rename(ckpt, Path(run_dir.path) / layout.CHECKPOINTS_DIR / name)
    cursor = DurableCursor(checkpoint=name, cursor=2, step=1, epoch=0, finished=False, fingerprint=plan.fingerprint)
    run_dir.commit_cursor(cursor)
    command = [sys.executable, str(Path(__file__).with_name("flow_side_resume.py")), run_dir.storage, run_dir.run_key]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the flow-side resume process failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(run_dir.path)
    return figures


def hash_speed(size: int = 512 << 20) -> dict[str, float]:
    """GB/s of sha256 (one thread, formats 2-3), of BLAKE3 in one thread and of the checkpoints' BLAKE3 stream over
    the hashing threads (format 4), and of a memcpy of the same bytes."""
    import blake3

    data = torch.randint(0, 256, (size,), dtype=torch.uint8).numpy()
    view = memoryview(data)
    copy = bytearray(size)  # touched once below so that the memcpy timing sees no page faults
    memoryview(copy)[:] = view

    def rate(action: Callable[[], Any]) -> float:
        started = time.perf_counter()
        action()
        return size / (time.perf_counter() - started) / 1e9

    def stream() -> None:
        hashing = checkpoint_digest.HashStream(BLAKE3)
        for start in range(0, size, checkpoint_digest.CHUNK_BYTES):
            hashing.add(view[start : start + checkpoint_digest.CHUNK_BYTES])
        hashing.hexdigest()

    return {
        "sha256_gbps": rate(lambda: hashlib.sha256(view).digest()),
        "blake3_gbps": rate(lambda: blake3.blake3(view).digest()),
        "stream_gbps": rate(stream),
        "memcpy_gbps": rate(lambda: memoryview(copy).__setitem__(slice(None), view)),
        "hash_threads": checkpoint_digest.HASH_THREADS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="span,boundary")
    parser.add_argument("--steps", type=int, default=4, help="measured steps of each kind (after one warm-up each)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    parser.add_argument("--smoke", action="store_true", help="a small DeBERTa-v3 instead of the real size")
    parser.add_argument("--resume-only", action="store_true", help="only checkpoint bytes and the resume figures")
    parser.add_argument("--load-only", action="store_true", help="only checkpoint bytes and the load figures")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of save, load and resume")
    parser.add_argument(
        "--overlap-rounds", type=int, default=1, help="rounds of the background vs blocking checkpoint measurement"
    )
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", str(min(os.cpu_count() or 2, 16)))))
    rows = []
    for arch in args.arch.split(","):
        with tempfile.TemporaryDirectory(prefix="realsize-", dir=os.environ.get("BENCH_TMP")) as tmp:
            rows.append(measure(arch, args, tmp))
        print(f"{arch}: done", file=sys.stderr, flush=True)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}, {'bf16' if args.bf16 else 'fp32'}")
    speed = hash_speed()
    print(
        f"load average {os.getloadavg()[0]:.2f} (at the start of each arch: {[r['load_average'] for r in rows]}); "
        f"sha256 {speed['sha256_gbps']:.2f} GB/s in one thread, BLAKE3 {speed['blake3_gbps']:.2f} GB/s in one "
        f"thread and {speed['stream_gbps']:.2f} GB/s as the checkpoints stream it ({speed['hash_threads']} "
        f"threads), memcpy {speed['memcpy_gbps']:.2f} GB/s"
    )
    touch = {size: first_touch(size, torch.get_num_threads()) for size in (2, 8)}
    print(
        "first touch of fresh memory in a fresh interpreter: "
        + ", ".join(f"{size} GB {micro:.2f} us per 4 KiB page" for size, micro in touch.items())
    )
    if args.load_only:
        print_load(rows)
    elif args.resume_only:
        print_resume(rows)
    else:
        print_all(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
