"""A study against a grid: where a grid over one learning rate finds a clearly best value, does the study (TPE
proposals, successive-halving pruning at validation points, pruned trials paused) reach the grid's best validation
F1, within its noise, using at most half of the grid's optimizer updates? Both figures are printed.

    python bench/tune.py                 # the demo's task: 6 grid points of 304 updates, 5 trials (long: see README)
    python bench/tune.py --quick         # a smaller task that checks the script (not the claim)
    python bench/tune.py --json out.json
    python bench/tune.py --grid-from out.json --min-epochs 3   # another study against the same grid (deterministic)

Task: the demo's (``flows.demo``): ``tiny:span:64x2:deberta``, 300 generated training records (seed 1), 40
validation records (seed 2), batches of 8, 8 epochs (304 updates), encoder lr 1e-3, validation every epoch, selection
by ``metric_for_best`` (``eval_f1`` unless the config says otherwise); the searched field is ``task_lr`` (the new
heads' learning rate, the setting a fresh corpus most needs), 1 torch thread everywhere.

- grid: ``task_lr`` at ``GRID`` (log-spaced), every point trained to its end. The runs are direct
  ``ManagedTraining`` runs in this process: the engine the training flow drives, with the same numbers bit for bit
  (``tests/test_flow.py``), without Prefect's per-run overhead. Updates: points x updates per run.
- noise: the grid's best point trained again under ``--noise-seeds`` other config seeds (data order, dropout,
  augmentation); the spread (sample standard deviation) of its selected F1 over those runs and the grid's own.
- study: ``tune_flow`` in this process (trials one at a time, as ``prefect-gliner2 tune`` runs them) against a
  local Prefect server, ``task_lr`` log-uniform over the grid's range, TPE after ``STARTUP`` random trials,
  successive halving from ``--min-epochs`` epochs' updates with reduction factor ``--reduction`` (defaults 2 and 2:
  pause points at epochs 2 and 4; at epoch 1 every point's F1 is still 0), ``--trials`` trials. Updates: the steps
  each trial's run trained (a run is counted once however many trials touch it). Then the study continues its most
  promising pruned trial to its end (``--continue-best``, default 1; ``continue_best`` of the flow): at the early
  pause points F1 barely tells the learning rates apart, and a pruned trial paused at a checkpoint costs only the
  rest of its run to find out.

Printed: the grid (F1 per point), the study's leaderboard, then the two figures side by side: best F1 and updates,
and whether the study is within the noise (best >= grid best - 2 x spread) at no more than half the updates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GRID = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
STARTUP = 3
MODEL = "tiny:span:64x2:deberta"
TASK: dict[str, Any] = {"train": 300, "valid": 40, "epochs": 8, "batch": 8}
QUICK: dict[str, Any] = {"train": 48, "valid": 16, "epochs": 3, "batch": 8}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a small task: checks the script, not the claim")
    parser.add_argument("--trials", type=int, default=5, help="study trials (default 5)")
    parser.add_argument("--min-epochs", type=int, default=2, help="the first pause point, in epochs (default 2)")
    parser.add_argument("--reduction", type=int, default=2, help="successive halving's reduction factor")
    parser.add_argument("--continue-best", type=int, default=1, help="pruned trials the study continues (default 1)")
    parser.add_argument("--noise-seeds", type=int, default=2, help="extra seeds of the grid's best point")
    parser.add_argument("--seed", type=int, default=0, help="the study's sampler seed")
    parser.add_argument("--dir", help="working directory (default: a temporary one)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--grid-from", help="take the grid and noise runs from an earlier --json of the same task")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    task = QUICK if args.quick else TASK
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-tune-"))
    data = _data(root, task)
    config = _config(task)
    grid, noise, grid_s = _grid(data, config, task, args)
    started = time.monotonic()
    study = _study(root, data, config, task, args)
    study_s = time.monotonic() - started
    figures = _figures(grid, noise, study, grid_s, study_s)
    _print(grid, study, figures, str(config["metric_for_best"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"task": task, "grid": grid, "study": study, **figures}, indent=1))
    return 0


def _grid(
    data: dict[str, str], config: dict[str, Any], task: dict[str, Any], args: Any
) -> tuple[list[dict[str, Any]], list[float], float]:
    """The grid's points and the noise runs of its best point: trained here, or read from an earlier run's JSON
    (the runs are deterministic: the same task gives the same numbers)."""
    if args.grid_from:
        earlier = json.loads(Path(args.grid_from).read_text())
        if earlier["task"] != task or [p["task_lr"] for p in earlier["grid"]] != list(GRID):
            raise SystemExit(f"{args.grid_from} holds another task or grid; run the grid again")
        return earlier["grid"], earlier["noise_runs"], float(earlier["grid_seconds"])
    started = time.monotonic()
    grid = [_direct(data, {**config, "task_lr": lr}) | {"task_lr": lr} for lr in GRID]
    grid_s = time.monotonic() - started
    best = max(grid, key=lambda point: point["best"])
    noise = [best["best"]] + [
        _direct(data, {**config, "task_lr": best["task_lr"], "seed": config["seed"] + k})["best"]
        for k in range(1, args.noise_seeds + 1)
    ]
    return grid, noise, grid_s


def _data(root: Path, task: dict[str, Any]) -> dict[str, str]:
    from prefect_gliner2.training.tiny import tiny_records

    (root / "data").mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, seed in (("train", 1), ("valid", 2)):
        path = root / "data" / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in tiny_records(task[name], seed=seed)))
        paths[name] = str(path)
    return paths


def _config(task: dict[str, Any]) -> dict[str, Any]:
    from prefect_gliner2.session_core import TrainingConfig

    config = TrainingConfig(
        fp16=False,
        bf16=False,
        num_epochs=task["epochs"],
        batch_size=task["batch"],
        eval_strategy="epoch",
        encoder_lr=1e-3,
        warmup_ratio=0.1,
        seed=7,
    )
    return config.to_dict()


def _direct(data: dict[str, str], config: dict[str, Any]) -> dict[str, Any]:
    """One grid run to its end, in this process: its selected metric, the metric per validation, its updates."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.records import load_records
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingConfig, TrainingSession

    torch.set_num_threads(1)
    plan = ManagedTrainingPlan(data["train"], TrainingConfig.from_dict(config), architecture="span")
    session = TrainingSession(load_model(MODEL), plan.config, max_steps=plan.max_steps)
    run = ManagedTraining(session, plan, eval_examples=load_records(data["valid"], what="validation").examples())
    try:
        result = run.run()
    finally:
        run.close()
    metric = str(plan.config.metric_for_best)
    curve = [round(float(entry[metric]), 4) for entry in result["eval_metrics_history"]]
    print(f"grid task_lr {config['task_lr']:.1e} seed {config['seed']}: {metric} per epoch {curve}", flush=True)
    return {"best": float(result["best_metric"]), "curve": curve, "updates": plan.max_steps}


def _study(root: Path, data: dict[str, str], config: dict[str, Any], task: dict[str, Any], args: Any) -> dict[str, Any]:
    from prefect_gliner2.flows.cli.server import prefect_api
    from prefect_gliner2.flows.tune import tune_flow

    per_epoch = -(-task["train"] // task["batch"])
    space = {
        "params": {"task_lr": {"type": "float", "low": GRID[0], "high": GRID[-1], "log": True}},
        "pruner": {
            "type": "successive_halving",
            "min_resource": per_epoch * args.min_epochs,
            "reduction_factor": args.reduction,
        },
        "sampler": {"type": "tpe", "n_startup_trials": STARTUP},
    }
    base = {"model": MODEL, "train_data": data["train"], "valid_data": data["valid"], "config": config}
    base |= {"storage": str(root / "runs"), "execution": {"cpu_threads": 1}, "checkpointing": {"checkpoint_every": 0}}
    with prefect_api():
        outcome = tune_flow(
            base=base,
            space=space,
            trials=args.trials,
            study_key=f"bench-{args.min_epochs}x{args.reduction}-t{args.trials}",
            study_storage_url=f"sqlite:///{root}/studies.db",
            deployment=None,
            seed=args.seed,
            continue_best=args.continue_best,
        )
    steps: dict[str, int] = {}
    for row in outcome["rows"]:
        steps[row["run_key"]] = max(steps.get(row["run_key"], 0), int(row["steps"] or 0))
    return {"rows": outcome["rows"], "best": outcome["best"], "updates": sum(steps.values())}


def _figures(
    grid: list[dict[str, Any]], noise: list[float], study: dict[str, Any], grid_s: float, study_s: float
) -> dict[str, Any]:
    best = max(grid, key=lambda point: point["best"])
    spread = statistics.stdev(noise) if len(noise) > 1 else 0.0
    study_best = study["best"]["value"] if study["best"] else None
    grid_updates = sum(point["updates"] for point in grid)
    return {
        "grid_best": best["best"],
        "grid_best_task_lr": best["task_lr"],
        "grid_updates": grid_updates,
        "noise_runs": noise,
        "noise_spread": spread,
        "study_best": study_best,
        "study_best_params": json.loads(study["best"]["params"]) if study["best"] else None,
        "study_updates": study["updates"],
        "updates_ratio": study["updates"] / grid_updates,
        "within_noise": study_best is not None and study_best >= best["best"] - 2 * spread,
        "at_most_half": study["updates"] <= grid_updates / 2,
        "grid_seconds": round(grid_s, 1),
        "study_seconds": round(study_s, 1),
    }


def _print(grid: list[dict[str, Any]], study: dict[str, Any], figures: dict[str, Any], metric: str) -> None:
    print(f"\ngrid over task_lr (each to its end), {metric}:")
    for point in grid:
        print(f"  task_lr {point['task_lr']:.1e}: best {point['best']:.4f}  per epoch {point['curve']}")
    print(f"\nstudy ({len(study['rows'])} trials), best first:")
    for row in study["rows"]:
        value = f"{row['value']:.4f}" if isinstance(row["value"], float) else row["value"]
        print(f"  trial {row['trial']:>2} {row['state']:<8} {value:<8} steps {row['steps']:>4}  {row['params']}")
    f = figures
    print(
        f"\n{metric}: grid best {f['grid_best']:.4f} (task_lr {f['grid_best_task_lr']:.1e}; spread over "
        f"{len(f['noise_runs'])} seeds {f['noise_spread']:.4f}) | study best "
        f"{(f['study_best'] or float('nan')):.4f} {f['study_best_params']}"
    )
    print(f"optimizer updates: grid {f['grid_updates']} | study {f['study_updates']} (ratio {f['updates_ratio']:.2f})")
    print(
        f"within noise (>= grid best - 2 x spread): {f['within_noise']}; at most half the updates: "
        f"{f['at_most_half']}  (grid {f['grid_seconds']} s, study {f['study_seconds']} s of wall time)"
    )


if __name__ == "__main__":
    sys.exit(main())
