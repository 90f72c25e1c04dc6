"""Session overhead vs gliner2's native `ExtractorTrainer.train()`, and checkpoint I/O vs raw I/O, side by side.

    python bench/session.py [--quick] [--json OUT]

For each model size (tiny: hidden 32 x 1 layer; bench: hidden 256 x 3 layers, ~100 ms per step on 2 cores) and
architecture, the same number of micro-batches runs (a) through native `train()` (its own loop; its checkpoint
writing switched off so that only training is timed) and (b) through the session's public operations. Printed:
per-operation means and the wall-time ratio session/native. Then checkpoint save_state/load_state seconds per GB
against a raw write+fsync / read of the same number of bytes, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # native train() draws a progress bar

import torch  # noqa: E402
from gliner2.training.trainer import ExtractorTrainer  # noqa: E402
from gliner2.training.trainer import TrainingConfig as NativeConfig  # noqa: E402

from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession  # noqa: E402
from prefect_gliner2.training.tiny import BENCH_MODEL_SIZE, build_tiny_model, tiny_records  # noqa: E402

DEVICE = "cpu"
SIZES = {"tiny": {"hidden_size": 32, "num_layers": 1}, "bench": dict(BENCH_MODEL_SIZE)}


class _NoSaveTrainer(ExtractorTrainer):
    def _save_checkpoint(self, name: str) -> None:  # time training only
        return None


def _config(tmp: str, **kw: Any) -> TrainingConfig:
    base = dict(
        output_dir=tmp,
        fp16=False,
        bf16=False,
        batch_size=8,
        gradient_accumulation_steps=2,
        num_epochs=1,
        eval_strategy="no",
        save_best=False,
        group_by_length=False,
        seed=1,
    )
    base.update(kw)
    return TrainingConfig(**base)


def native_run(arch: str, size: dict[str, int], records: list[dict[str, Any]], config: TrainingConfig) -> float:
    kwargs = config.to_native_kwargs()
    kwargs.update(fp16=False, pin_memory=False, report_to_wandb=False, num_workers=0)
    trainer = _NoSaveTrainer(build_tiny_model(arch, seed=0, **size), NativeConfig(**kwargs))
    started = time.perf_counter()
    trainer.train(train_data=[dict(r) for r in records])
    return time.perf_counter() - started


def session_run(
    arch: str, size: dict[str, int], records: list[dict[str, Any]], config: TrainingConfig, tmp: str
) -> dict[str, Any]:
    plan = ManagedTrainingPlan(records, config, architecture=arch)
    session = TrainingSession(build_tiny_model(arch, seed=0, **size), config, max_steps=plan.max_steps, device=DEVICE)
    fb, step = [], []
    started = time.perf_counter()
    for i in range(plan.batch_count):
        t = time.perf_counter()
        session.forward_backward(plan.batch(i))
        fb.append(time.perf_counter() - t)
        if plan.is_update(i):
            t = time.perf_counter()
            session.optim_step()
            step.append(time.perf_counter() - t)
    wall = time.perf_counter() - started
    t = time.perf_counter()
    session.forward(plan.batch(0))
    forward = time.perf_counter() - t
    io = checkpoint_io(
        session,
        tmp,
        lambda: TrainingSession(
            build_tiny_model(arch, seed=0, **size), config, max_steps=plan.max_steps, device=DEVICE
        ),
    )
    session.close()
    return {
        "wall": wall,
        "forward_backward_ms": 1e3 * mean(fb),
        "optim_step_ms": 1e3 * mean(step),
        "forward_ms": 1e3 * forward,
        "micro_batches": plan.batch_count,
        **io,
    }


def checkpoint_io(session: TrainingSession, tmp: str, fresh: Any) -> dict[str, float]:
    target = Path(tmp) / f"ckpt-{time.monotonic_ns()}"
    t = time.perf_counter()
    session.save_state(str(target))
    save = time.perf_counter() - t
    size = sum(f.stat().st_size for f in target.iterdir())
    other = fresh()
    t = time.perf_counter()
    other.load_state(str(target))
    load = time.perf_counter() - t
    other.close()
    raw_write, raw_read = raw_io(size, tmp)
    shutil.rmtree(target)
    gb = size / 1e9
    return {
        "checkpoint_bytes": size,
        "save_s_per_gb": save / gb,
        "raw_write_s_per_gb": raw_write / gb,
        "load_s_per_gb": load / gb,
        "raw_read_s_per_gb": raw_read / gb,
    }


def raw_io(size: int, tmp: str) -> tuple[float, float]:
    path = Path(tmp) / "raw.bin"
    data = os.urandom(size)
    t = time.perf_counter()
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    write = time.perf_counter() - t
    t = time.perf_counter()
    path.read_bytes()
    read = time.perf_counter() - t
    path.unlink()
    return write, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model only, fewer records")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (native train() picks CUDA when available)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA with native bf16 only)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the best of each is kept")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    rows = []
    sizes = {"tiny": SIZES["tiny"]} if args.quick else SIZES
    for name, size in sizes.items():
        n = 32 if name == "tiny" and args.quick else 64
        records = tiny_records(n, seed=3)
        for arch in ("span", "boundary"):
            natives, runs = [], []
            for _ in range(args.repeats):  # interleaved, best of N: both sides see the same machine state
                with tempfile.TemporaryDirectory() as tmp:
                    config = _config(tmp, bf16=args.bf16)
                    natives.append(native_run(arch, size, records, config))
                    runs.append(session_run(arch, size, records, config, tmp))
            native = min(natives)
            ours = min(runs, key=lambda r: r["wall"])
            rows.append(
                {
                    "model": name,
                    "arch": arch,
                    "native_s": native,
                    "session_s": ours["wall"],
                    "ratio": ours["wall"] / native,
                    **ours,
                }
            )
    where = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}, {'bf16' if args.bf16 else 'fp32'}")
    print(
        f"{'model':6} {'arch':9} {'micro':>5} {'native s':>9} {'session s':>9} {'ratio':>6} {'fb ms':>7} "
        f"{'step ms':>7} {'fwd ms':>7}"
    )
    for r in rows:
        print(
            f"{r['model']:6} {r['arch']:9} {r['micro_batches']:5d} {r['native_s']:9.3f} {r['session_s']:9.3f} "
            f"{r['ratio']:6.3f} {r['forward_backward_ms']:7.1f} {r['optim_step_ms']:7.1f} {r['forward_ms']:7.1f}"
        )
    print(
        f"\n{'model':6} {'arch':9} {'ckpt MB':>8} {'save s/GB':>9} {'raw w s/GB':>10} {'ratio':>6} "
        f"{'load s/GB':>9} {'raw r s/GB':>10} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['model']:6} {r['arch']:9} {r['checkpoint_bytes'] / 1e6:8.1f} {r['save_s_per_gb']:9.2f} "
            f"{r['raw_write_s_per_gb']:10.2f} {r['save_s_per_gb'] / r['raw_write_s_per_gb']:6.2f} "
            f"{r['load_s_per_gb']:9.2f} {r['raw_read_s_per_gb']:10.2f} "
            f"{r['load_s_per_gb'] / r['raw_read_s_per_gb']:6.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
