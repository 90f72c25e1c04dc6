"""Fresh-process continuation: rebuild the same session, load a checkpoint, finish the plan, report.

Usage, with tests/ on PYTHONPATH:
    python -m support.session_child '{"arch": "span", "lora": false, "checkpoint": "...", "out": "...",
        "mode": "direct" | "managed", "start": 4, "config": {...}, "train_n": 9, "eval": true}'
Prints one JSON line; writes the snapshot (see support.session.snapshot) to `out` as safetensors.
"""

from __future__ import annotations

import json
import sys

import safetensors.torch

from prefect_gliner2.training import ManagedTraining, TrainingSession

from support.session import eval_records, make_config, make_model, make_plan, run_direct, snapshot


def main() -> None:
    args = json.loads(sys.argv[1])
    config = make_config(args["arch"], args["lora"], **args.get("config", {}))
    plan = make_plan(args["arch"], config, args.get("train_n", 9))
    session = TrainingSession(make_model(args["arch"]), config, max_steps=plan.max_steps, device=args.get("device"))
    result: dict = {}
    if args["mode"] == "direct":
        session.load_state(args["checkpoint"])
        result["losses"] = run_direct(session, plan, start=args["start"])
    else:
        managed = ManagedTraining(session, plan, eval_examples=eval_records() if args.get("eval") else None)
        managed.load_state(args["checkpoint"])
        summary = managed.run()
        result.update(
            {
                k: summary[k]
                for k in (
                    "train_metrics_history",
                    "eval_metrics_history",
                    "best_metric",
                    "best_step",
                    "total_steps",
                    "stopped_early",
                )
            }
        )
        if args.get("export"):
            managed.export_weights(args["export"])
    safetensors.torch.save_file(snapshot(session), args["out"])
    result["step"] = session.step
    print(json.dumps(result))


if __name__ == "__main__":
    main()
