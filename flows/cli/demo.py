"""``prefect-gliner2 demo``: train the built-in tiny model on generated data through the training flow, offline,
and show what it learned (``flows/demo.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from prefect_gliner2.flows.cli.progress import describe
from prefect_gliner2.flows.cli.server import prefect_api

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo", help="train the built-in tiny model on generated data, offline"
    )
    parser.add_argument("--dir", default="prefect-gliner2-demo", help="where data, runs and the model go")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.flows.demo import demo_report, run_demo
    from prefect_gliner2.runtime.spare import spare_worker

    with spare_worker(), prefect_api():  # the worker process imports torch and gliner2 while Prefect starts
        summary = run_demo(args.dir)
    print(describe(summary))
    print(demo_report(summary["demo"]))
    return 0
