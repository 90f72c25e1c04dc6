"""Training-loop cost of the session's steps against gliner2's native step, in blocks of consecutive steps.

    python bench/step_loop.py [--device cpu|cuda] [--shape 768x6|base|tiny] [--arch span|boundary] [--bf16]
                              [--block 16] [--rounds 6]

On one model and one session, blocks of `--block` consecutive steps (batch 2, one micro-batch per update, as
bench/realsize.py) of three kinds take turns, each block timed from a device synchronisation to the next:
- native: the engine's `_backward_one` + `_optimizer_step` (what native `train()` runs per batch; it reads nothing
  from the device between steps), the session's hooks idle;
- public: `TrainingSession.forward_backward` + `optim_step` (the loss returned as a float: one host read per
  micro-batch, and one per update);
- managed: `queue_forward_backward` + `optim_step` + `take_losses`, what `ManagedTraining` (and so the flow's worker)
  runs: one host read per update.
Unlike bench/realsize.py's step ratio, which synchronises around every single step, consecutive steps here let an
accelerator overlap the host's preparation of the next batch with the device's work: what a host read in the middle
of the loop costs shows up. Prints each kind's median seconds per step and its median per-round ratio to native with
the range. On a CPU the host reads cost nothing (the work is synchronous anyway): the ratios are noise around 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from overlap import bench_config  # noqa: E402  (bench/overlap.py, beside this script)

from prefect_gliner2.session_core.pairs import to_pairs  # noqa: E402
from prefect_gliner2.training import ManagedTrainingPlan, TrainingSession  # noqa: E402
from prefect_gliner2.training.engine import private_python_rng  # noqa: E402
from prefect_gliner2.training.tiny import GLINER2_BASE_SIZE, save_tiny_model, tiny_records  # noqa: E402

SHAPES = {
    "tiny": {"hidden_size": 32, "num_layers": 1},
    "768x6": {"hidden_size": 768, "num_layers": 6},  # bench/flow.py's ~1 s case (tiny:span:768x6)
    "base": dict(GLINER2_BASE_SIZE),
}
KINDS = ("native", "public", "managed")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="768x6")
    parser.add_argument("--arch", choices=("span", "boundary"), default="span")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--block", type=int, default=16, help="consecutive steps per timed block")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of one block of each kind (after a warm-up)")
    args = parser.parse_args()

    from gliner2.auto import AutoExtractor

    with tempfile.TemporaryDirectory(prefix="step-loop-") as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model", args.arch, seed=0, dropout=0.1, **SHAPES[args.shape])
        cfg = bench_config(tmp, args.bf16)
        plan = ManagedTrainingPlan(tiny_records(64, seed=3), cfg, architecture=args.arch)
        session = TrainingSession(
            AutoExtractor.from_pretrained(str(model_dir)), cfg, max_steps=10**9, device=args.device
        )
    engine = session.engine
    hooks = engine.optimizer._optimizer_step_pre_hooks  # the session's update guard: idle for native steps
    cursor = {"i": 0}

    def batch():
        cursor["i"] += 1
        return plan.batch(cursor["i"] % plan.batch_count)

    def native() -> None:
        saved = dict(hooks)
        hooks.clear()
        try:
            with private_python_rng(engine.python_rng):
                collated = engine.train_collator(to_pairs(batch()))
            engine._backward_one(collated, 0, engine.use_amp, engine.amp_dtype, is_last_micro=True)
            engine._optimizer_step()
            engine.global_step += 1
        finally:
            hooks.update(saved)

    def public() -> None:
        session.forward_backward(batch())
        session.optim_step()

    def managed() -> None:
        session.queue_forward_backward(batch())
        session.optim_step()
        session.take_losses()

    run = {"native": native, "public": public, "managed": managed}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for round_ in range(args.rounds + 1):
        order = KINDS[round_ % 3 :] + KINDS[: round_ % 3]  # each kind goes first in turn
        for kind in order:
            sync(args.device)
            started = time.perf_counter()
            for _ in range(args.block):
                run[kind]()
            sync(args.device)
            if round_:  # round 0 warms up
                times[kind].append((time.perf_counter() - started) / args.block)
    session.close()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(
        f"{args.shape} {args.arch} {'bf16' if args.bf16 else 'fp32'} on {name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.block} consecutive steps per kind"
    )
    for kind in KINDS:
        ratios = [t / n for t, n in zip(times[kind], times["native"], strict=True)]
        step_ms = statistics.median(times[kind]) * 1e3
        ratio = statistics.median(ratios)
        print(f"  {kind:8} {step_ms:9.2f} ms/step   vs native {ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
