"""``prefect-gliner2 plan``: build a run's plan and print its summary, print the manifest, or write it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefect_gliner2.flows.cli.args import data_arguments, inputs

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "plan", help="build a plan; print its summary, the manifest, or write it"
    )
    data_arguments(parser, config_required=True)
    parser.add_argument("--out", help="write the manifest here (it contains the training data)")
    parser.add_argument("--print", dest="print_manifest", action="store_true", help="print the whole manifest JSON")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.runtime.model_sources import model_architecture
    from prefect_gliner2.session_core import ManagedTrainingPlan
    from prefect_gliner2.session_core.manifest import encode_manifest, write_manifest

    config, train, valid = inputs(args)
    plan = ManagedTrainingPlan(train, config, architecture=model_architecture(args.model))
    manifest = encode_manifest(plan, valid)
    if args.out:
        write_manifest(manifest.data, args.out)
    if args.print_manifest:
        sys.stdout.write(manifest.data.decode("utf-8"))
        return 0
    print(
        f"plan {plan.fingerprint} ({plan.architecture}): {len(plan.records)} training records, "
        f"{manifest.eval_record_count} validation records\n"
        f"  {plan.batch_count} batches over {plan.num_epochs} epoch(s), {plan.max_steps} optimizer updates, "
        f"{len(plan.validations())} validation point(s)\n"
        f"  manifest content address {manifest.content_address}"
        + (f"\n  written to {args.out} (it contains the training data)" if args.out else "")
    )
    return 0
