"""Training time lost per checkpoint, synchronous vs background writes, measured side by side in one process.

    python bench/overlap.py [--size tiny|medium|base] [--arch span] [--steps 4] [--rounds 3] [--device cpu|cuda]

A randomly initialised model of the chosen shape is built offline and trained with batch 2 (one optimizer step per
batch). Each round, in one process and on one session, interleaved:

- `steps` plain steps (their times, over all rounds, give the median step time);
- a synchronous checkpoint (``save_state``): training waits for the whole write, so that time is lost;
- `steps` plain steps again;
- a background checkpoint: the snapshot (``state_payload(snapshot=True)``: detached host copies; training waits
  for it), then the write in a thread (``write_checkpoint``, as the worker's writer thread does) while training
  goes on, one step after another until the write has ended. Lost: the snapshot plus, for every step trained
  during the write, its time above the median step (the writer shares the CPUs, memory bandwidth and the GIL).

Medians over rounds are printed: seconds lost per checkpoint each way and their ratio (background / sync), the
snapshot and background write seconds and the steps trained during the write. `checkpoint_overlap` is the
measurement; bench/realsize.py calls it at the real size (its "bg vs block" column).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

from prefect_gliner2.session_core.checkpoint import write_checkpoint  # noqa: E402
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession  # noqa: E402
from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 32, "num_layers": 1},
    "medium": {
        "hidden_size": 384,
        "num_layers": 6,
        "num_heads": 6,
        "intermediate_size": 1536,
        "vocab_size": 32_000,
        "encoder": "deberta-v2",
        "deberta_v3": True,
    },
    "base": dict(GLINER2_BASE_SIZE),
}


def bench_config(tmp: str, bf16: bool) -> TrainingConfig:
    """Batch 2, one optimizer step per batch, no validation: the real-size benchmarks' training settings."""
    return TrainingConfig(
        output_dir=tmp,
        fp16=False,
        bf16=bf16,
        batch_size=2,
        gradient_accumulation_steps=1,
        num_epochs=1,
        eval_strategy="no",
        save_best=False,
        group_by_length=False,
        seed=1,
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def checkpoint_overlap(
    model_dir: str | Path,
    architecture: str,
    tmp: str,
    *,
    steps: int = 4,
    rounds: int = 3,
    device: str = "cpu",
    bf16: bool = False,
) -> dict[str, float]:
    """Seconds of training lost per checkpoint written synchronously and in the background (see the module
    docstring), on a fresh session of the model at `model_dir`; checkpoints go under `tmp` and are deleted."""
    from gliner2.auto import AutoExtractor

    cfg = bench_config(tmp, bf16)
    # enough distinct batches for every step of every round (the background rounds may run more: they wrap around)
    plan = ManagedTrainingPlan(tiny_records(2 * (4 * steps + 8) * rounds, seed=3), cfg, architecture=architecture)
    trainer = _Trainer(
        TrainingSession(AutoExtractor.from_pretrained(str(model_dir)), cfg, max_steps=10**9, device=device),
        plan,
        device,
    )
    session = trainer.session
    parameters = sum(p.numel() for p in session.model.parameters())
    samples: dict[str, list[float]] = {"sync_lost_s": [], "bg_lost_s": [], "snapshot_s": [], "bg_steps": []}
    samples["bg_write_s"] = []
    baseline: list[float] = []
    size = 0
    try:
        trainer.step()  # warm-up: the AdamW moments exist from here on, as in a real checkpoint
        for round_ in range(rounds):
            baseline += [trainer.step() for _ in range(steps)]
            uri = f"{tmp}/sync-{round_}"
            started = time.perf_counter()
            session.save_state(uri)  # training waits for all of it
            samples["sync_lost_s"].append(time.perf_counter() - started)
            size = sum(f.stat().st_size for f in Path(uri).iterdir())
            shutil.rmtree(uri)
            baseline += [trainer.step() for _ in range(steps)]
            snapshot, overlapped, written = _background(trainer, f"{tmp}/bg-{round_}")
            samples["snapshot_s"].append(snapshot)
            samples["bg_write_s"].append(written)
            samples["bg_steps"].append(len(overlapped))
            samples["bg_lost_s"].append(snapshot + sum(overlapped) - len(overlapped) * statistics.median(baseline))
    finally:
        session.close()
    result = {key: statistics.median(values) for key, values in samples.items()}
    result.update(parameters=parameters, checkpoint_bytes=size, step_s=statistics.median(baseline))
    result["bg_vs_sync"] = result["bg_lost_s"] / result["sync_lost_s"]
    return result


class _Trainer:
    """Optimizer steps of batch 2 over the plan's batches, in order, wrapping around; `step()` returns its time."""

    def __init__(self, session: TrainingSession, plan: ManagedTrainingPlan, device: str) -> None:
        self.session, self.plan, self.device = session, plan, device
        self.position = 0

    def step(self) -> float:
        started = time.perf_counter()
        self.session.forward_backward(self.plan.batch(self.position % self.plan.batch_count))
        self.session.optim_step()
        _sync(self.device)
        self.position += 1
        return time.perf_counter() - started


def _background(trainer: _Trainer, uri: str) -> tuple[float, list[float], float]:
    """The snapshot's seconds, the times of the steps trained while the write ran (at least one), and the write's
    seconds."""
    started = time.perf_counter()
    files, meta = trainer.session.state_payload(snapshot=True)
    _sync(trainer.device)
    snapshot = time.perf_counter() - started
    failed: list[BaseException] = []
    ended: list[float] = []

    def write() -> None:
        try:
            write_checkpoint(uri, files, meta)
            ended.append(time.perf_counter())
        except BaseException as exc:  # noqa: BLE001 - raised below, in the measuring thread
            failed.append(exc)

    writer = threading.Thread(target=write, name="checkpoint-writer")
    begun = time.perf_counter()
    writer.start()
    overlapped = [trainer.step()]
    while writer.is_alive():
        overlapped.append(trainer.step())
    writer.join()
    if failed:
        raise failed[0]
    shutil.rmtree(uri)
    return snapshot, overlapped, ended[0] - begun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--arch", default="span")
    parser.add_argument("--steps", type=int, default=4, help="steps after each checkpoint (and of the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", str(min(os.cpu_count() or 2, 16)))))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, size {args.size}")
    print(
        f"{'arch':9} {'params M':>8} {'ckpt MB':>8} {'step s':>7} {'sync lost s':>11} {'bg lost s':>9} "
        f"{'bg/sync':>7} {'snapshot s':>10} {'write s':>7} {'bg steps':>8}"
    )
    for arch in args.arch.split(","):
        with tempfile.TemporaryDirectory(prefix="overlap-", dir=os.environ.get("BENCH_TMP")) as tmp:
            model_dir = save_tiny_model(Path(tmp) / "model", arch, seed=0, dropout=0.1, **SIZES[args.size])
            r = checkpoint_overlap(
                model_dir, arch, tmp, steps=args.steps, rounds=args.rounds, device=args.device, bf16=args.bf16
            )
        print(
            f"{arch:9} {r['parameters'] / 1e6:8.1f} {r['checkpoint_bytes'] / 1e6:8.0f} {r['step_s']:7.3f} "
            f"{r['sync_lost_s']:11.3f} "
            f"{r['bg_lost_s']:9.3f} {r['bg_vs_sync']:7.2f} {r['snapshot_s']:10.3f} {r['bg_write_s']:7.2f} "
            f"{r['bg_steps']:8.0f}"
        )
    print(
        "lost: training seconds lost per checkpoint; sync: the save; background: the snapshot plus the extra time of "
        "the bg steps trained during the write (vs the median step); bg/sync < 1: less lost"
    )


if __name__ == "__main__":
    main()
