"""Validation cost vs one epoch of training, side by side: native eval losses, and losses plus extraction P/R/F1.

    python bench/validation.py [--train 128] [--valid 32] [--repeats 2] [--json OUT]

On the ~100 ms/step model (``BENCH_MODEL_SIZE``, hidden 256 x 3 layers) and the tiny one, per architecture: one
epoch of ``--train`` records through the session (batch 8), then validation of ``--valid`` records as the managed
driver runs it (`evaluate_session`: eval-mode losses, then gliner2's batched extraction scored against the gold).
Printed: seconds per part (best of ``--repeats``) and each validation's cost as a fraction of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from prefect_gliner2.session_core.evaluation import evaluate_session  # noqa: E402
from prefect_gliner2.session_core.pairs import to_pairs  # noqa: E402
from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession  # noqa: E402
from prefect_gliner2.training.tiny import BENCH_MODEL_SIZE, build_tiny_model, tiny_records  # noqa: E402

SIZES = {"tiny": {"hidden_size": 32, "num_layers": 1}, "bench": dict(BENCH_MODEL_SIZE)}


def measure(arch: str, size: str, n_train: int, n_valid: int) -> dict[str, float]:
    config = TrainingConfig(fp16=False, bf16=False, batch_size=8, num_epochs=1, eval_strategy="no", seed=1)
    plan = ManagedTrainingPlan(tiny_records(n_train, seed=1), config, architecture=arch)
    session = TrainingSession(build_tiny_model(arch, seed=0, **SIZES[size]), config, max_steps=plan.max_steps)
    pairs = to_pairs(tiny_records(n_valid, seed=2))
    batches = [pairs[i : i + config.eval_batch_size] for i in range(0, len(pairs), config.eval_batch_size)]
    try:
        started = time.perf_counter()
        for i in range(plan.batch_count):
            session.forward_backward(plan.batch(i))
            if plan.is_update(i):
                session.optim_step()
        epoch = time.perf_counter() - started
        started = time.perf_counter()
        evaluate_session(session, batches, extraction=False, threshold=0.5)
        losses = time.perf_counter() - started
        started = time.perf_counter()
        metrics = evaluate_session(session, batches, extraction=True, threshold=0.5)
        full = time.perf_counter() - started
    finally:
        session.close()
    return {"epoch_s": epoch, "losses_s": losses, "full_s": full, "f1": float(metrics["eval_f1"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=128, help="training records per epoch (batch 8)")
    parser.add_argument("--valid", type=int, default=32, help="validation records")
    parser.add_argument("--repeats", type=int, default=2, help="best of N")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    print(
        f"validation of {args.valid} records vs one epoch of {args.train} training records (batch 8), best of "
        f"{args.repeats}"
    )
    print(f"{'model':<18} {'epoch s':>8} {'losses s':>9} {'+extract s':>11} {'losses/epoch':>13} {'full/epoch':>11}")
    for size in ("tiny", "bench"):
        for arch in ("span", "boundary"):
            runs = [measure(arch, size, args.train, args.valid) for _ in range(args.repeats)]
            best = {key: min(run[key] for run in runs) for key in ("epoch_s", "losses_s", "full_s")}
            row = {"model": f"{size} {arch}", **best}
            row["losses_fraction"] = best["losses_s"] / best["epoch_s"]
            row["full_fraction"] = best["full_s"] / best["epoch_s"]
            rows.append(row)
            print(
                f"{row['model']:<18} {best['epoch_s']:8.2f} {best['losses_s']:9.2f} {best['full_s']:11.2f} "
                f"{row['losses_fraction']:13.3f} {row['full_fraction']:11.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
