"""``prefect-gliner2 tune``: an Optuna study whose trials are training runs (``flows.tune``), checked whole before any
training (data, config, search space), then run through Prefect: in this process, one trial at a time, or on the
fleet through the training deployment (``--deployment``, ``--parallel K``).

    prefect-gliner2 tune --model M --train T --valid V --config C --space SPACE.yaml --trials N \\
                         [--parallel K --deployment gliner2-train/train] [--study-key KEY] [--storage URL]

``--storage`` is the study's Optuna storage URL (``optuna-dashboard URL`` shows it); ``--run-storage`` is where the
trials' run directories live (``train --storage``). The same command after a kill continues the study;
``--continue-trial N`` continues pruned trial N from its pause point to its end.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefect_gliner2.flows.cli.args import UsageError, auto_or, check_storage, data_arguments, inputs, one, positive
from prefect_gliner2.flows.cli.server import prefect_api

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "tune", help="an Optuna study over training runs: pruned trials pause at a checkpoint, resumable"
    )
    data_arguments(parser, config_required=True)
    parser.add_argument("--space", required=True, help="search space YAML: params, pruner, sampler")
    parser.add_argument("--trials", type=positive, required=True, help="trials the study should have")
    parser.add_argument("--parallel", type=positive, default=1, help="trials at once (needs --deployment)")
    parser.add_argument(
        "--deployment",
        nargs="?",
        const="gliner2-train/train",
        help="train trials as flow runs of this deployment on the fleet (default without a value: gliner2-train/train;"
        " without the option: in this process)",
    )
    parser.add_argument("--study-key", default="study", help="names the study; the same key continues it")
    parser.add_argument(
        "--storage",
        dest="study_storage",
        help="Optuna storage URL (default: $PREFECT_GLINER2_STUDY_STORAGE, else SQLite)",
    )
    parser.add_argument("--run-storage", help="local directory or fsspec URL for the trials' run directories")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument(
        "--continue-trial", type=int, action="append", default=[], help="continue this pruned trial (repeatable)"
    )
    parser.add_argument(
        "--continue-best", type=int, default=0, help="after the trials, continue the K most promising pruned ones"
    )
    parser.add_argument("--register-root", help="register the best trial's model in this registry")
    parser.add_argument("--register-name", help="... under this model name")
    parser.add_argument("--cpu-threads", type=positive, help="torch threads in each trial's worker")
    parser.add_argument("--batches-per-task", type=auto_or(positive), default="auto", help="batches per Prefect task")
    parser.add_argument("--json", action="store_true", help="print the leaderboard and the best trial as JSON")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.flows.tune_study import optuna_module
    from prefect_gliner2.session_core.search_space import load_search_space

    optuna_module()  # refuses now when the tune extra is missing
    config, train, valid = inputs(args)
    if args.run_storage:
        check_storage(args.run_storage)
    if args.parallel > 1 and not args.deployment:
        raise UsageError("--parallel needs --deployment: in this process trials train one at a time")
    if bool(args.register_root) != bool(args.register_name):
        raise UsageError("pass --register-root and --register-name together")
    space = load_search_space(args.space)
    base = _base(args, config, train, valid)
    parameters = _parameters(args, base, space.to_dict())
    from prefect_gliner2.flows.tune import check_study

    check_study(base, space, args.study_key)  # the flow's checks, before a server or a flow run starts
    with prefect_api():
        from prefect_gliner2.flows.tune import tune_flow

        state = tune_flow(**parameters, return_state=True)
    if not state.is_completed():
        print(
            f"prefect-gliner2 tune: study {args.study_key} failed: {state.result(raise_on_failure=False)}\n"
            "fix the cause and run the same command again: the study continues where it stopped",
            file=sys.stderr,
        )
        return 1
    outcome = state.result()
    print(json.dumps(outcome, indent=1, default=str) if args.json else describe(outcome))
    return 0


def _base(args: Any, config: Any, train: list[str], valid: list[str] | None) -> dict[str, Any]:
    base: dict[str, Any] = {"model": args.model, "train_data": one(train), "valid_data": one(valid)}
    base["config"] = config.to_dict()
    if args.run_storage:
        base["storage"] = args.run_storage
    execution = {"batches_per_task": args.batches_per_task}
    if args.cpu_threads:
        execution["cpu_threads"] = args.cpu_threads
    base["execution"] = execution
    return base


def _parameters(args: Any, base: dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    parameters = {
        "base": base,
        "space": space,
        "trials": args.trials,
        "study_key": args.study_key,
        "study_storage_url": args.study_storage,
        "parallel": args.parallel,
        "deployment": args.deployment,
        "seed": args.seed,
        "continue_trials": args.continue_trial,
        "continue_best": args.continue_best,
    }
    if args.register_root:
        parameters["registry"] = {"registry_root": args.register_root, "model_name": args.register_name}
    return parameters


def describe(outcome: dict[str, Any]) -> str:
    """The leaderboard in words: one line per trial, best first, then the best trial's model."""
    lines = [f"study {outcome['study_key']} ({outcome['storage']}):"]
    for row in outcome["rows"]:
        value = row["value"]
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        lines.append(
            f"  {row['rank']:>3}. trial {row['trial']:<3} {row['state']:<8} {row['metric']} {shown:<10} "
            f"steps {row['steps']}  {row['params']}" + (f"  ({row['note']})" if row["note"] else "")
        )
    best = outcome.get("best")
    if best is None:
        lines.append("no trial completed")
    else:
        lines.append(f"best: trial {best['trial']} {best['metric']} {best['value']:.6g}; model at {best['export']}")
    if outcome.get("registered"):
        lines.append(f"registered as version {outcome['registered']['version']} at {outcome['registered']['uri']}")
    return "\n".join(lines)
