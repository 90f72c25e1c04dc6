"""Training time lost per checkpoint, synchronous vs background writes, measured side by side in one process.

    python bench/overlap.py [--size tiny|medium|base] [--arch span] [--steps 4] [--rounds 3] [--device cpu|cuda]

A randomly initialised model of the chosen shape is built offline and trained with batch 2. Each round, in one
process and on one session, measures interleaved:

- ``train``: `steps` optimizer steps without a checkpoint (the per-step baseline of that round);
- ``sync``: ``save_state`` (what a synchronous checkpoint does: training waits for the whole write), then `steps`
  steps; lost = wall time - steps x baseline;
- ``background``: the snapshot (``state_payload(snapshot=True)``: detached host copies), the write started in a
  thread (``write_checkpoint``, as the worker's writer thread does), then steps until the write has ended (at least
  `steps`); lost = wall time - steps run x baseline. It counts the snapshot, the training slowed down by the
  writer sharing the CPUs, and any wait for the write.

Medians over rounds are printed: seconds lost per checkpoint each way and their ratio (background / sync), plus
the snapshot and write seconds. `checkpoint_overlap` is the measurement; bench/realsize.py calls it at the real
size (its "bg vs block" column).
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

from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig, TrainingSession  # noqa: E402
from prefect_gliner2.session_core.checkpoint import write_checkpoint  # noqa: E402
from prefect_gliner2.session_core.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records  # noqa: E402

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


def _config(tmp: str, bf16: bool) -> TrainingConfig:
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

    cfg = _config(tmp, bf16)
    # enough distinct batches for every step of every round (the background rounds may run a few more)
    plan = ManagedTrainingPlan(tiny_records(2 * (6 * steps + 16) * rounds, seed=3), cfg, architecture=architecture)
    session = TrainingSession(
        AutoExtractor.from_pretrained(str(model_dir)), cfg, max_steps=plan.max_steps, device=device
    )
    position = [0]

    def step() -> None:
        session.forward_backward(plan.batch(position[0]))
        session.optim_step()
        position[0] += 1

    parameters = sum(p.numel() for p in session.model.parameters())
    try:
        step()  # warm-up: the AdamW moments exist from here on, as in a real checkpoint
        _sync(device)
        samples: dict[str, list[float]] = {"step_s": [], "sync_lost_s": [], "bg_lost_s": [], "snapshot_s": []}
        samples |= {"sync_write_s": [], "bg_write_s": [], "bg_steps": []}
        size = 0
        for round_ in range(rounds):
            started = time.perf_counter()
            for _ in range(steps):
                step()
            _sync(device)
            baseline = (time.perf_counter() - started) / steps
            samples["step_s"].append(baseline)
            sync_lost, write_s, size = _synchronous(session, step, steps, baseline, f"{tmp}/sync-{round_}", device)
            samples["sync_lost_s"].append(sync_lost)
            samples["sync_write_s"].append(write_s)
            measured = _background(session, step, steps, baseline, f"{tmp}/bg-{round_}", device)
            for key, value in measured.items():
                samples[key].append(value)
    finally:
        session.close()
    result = {key: statistics.median(values) for key, values in samples.items()}
    result.update(parameters=parameters, checkpoint_bytes=size)
    result["bg_vs_sync"] = result["bg_lost_s"] / result["sync_lost_s"] if result["sync_lost_s"] > 0 else float("nan")
    return result


def _synchronous(
    session: TrainingSession, step: Any, steps: int, baseline: float, uri: str, device: str
) -> tuple[float, float, int]:
    started = time.perf_counter()
    session.save_state(uri)
    written = time.perf_counter() - started
    size = sum(f.stat().st_size for f in Path(uri).iterdir())
    for _ in range(steps):
        step()
    _sync(device)
    lost = time.perf_counter() - started - steps * baseline
    shutil.rmtree(uri)
    return lost, written, size


def _background(
    session: TrainingSession, step: Any, steps: int, baseline: float, uri: str, device: str
) -> dict[str, float]:
    started = time.perf_counter()
    files, meta = session.state_payload(snapshot=True)
    _sync(device)
    snapshot = time.perf_counter() - started
    ended: list[float] = []

    def write() -> None:
        write_checkpoint(uri, files, meta)
        ended.append(time.perf_counter())

    writer = threading.Thread(target=write, name="checkpoint-writer")
    writer.start()
    ran = 0
    while ran < steps or writer.is_alive():
        step()
        ran += 1
    _sync(device)
    writer.join()
    if not ended:
        raise RuntimeError(f"the background write of {uri} failed (see the thread's traceback above)")
    lost = time.perf_counter() - started - ran * baseline
    shutil.rmtree(uri)
    return {"bg_lost_s": lost, "snapshot_s": snapshot, "bg_write_s": ended[0] - started - snapshot, "bg_steps": ran}


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
            f"{r['bg_lost_s']:9.3f} {r['bg_vs_sync']:7.2f} {r['snapshot_s']:10.3f} {r['sync_write_s']:7.2f} "
            f"{r['bg_steps']:8.0f}"
        )
    print("lost: training seconds lost per checkpoint (wall time minus the steps' baseline time); bg/sync < 1: less")


if __name__ == "__main__":
    main()
