"""``prefect-gliner2 init-model``: a new GLiNER2 span or boundary model on a pretrained encoder, ready to train."""

from __future__ import annotations

import argparse
import json
from typing import Any

from prefect_gliner2.flows.cli.args import non_negative

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "init-model",
        help="build a new GLiNER2 model on a pretrained encoder (offline for a local encoder directory)",
        description="Build a GLiNER2 model on a pretrained encoder the way gliner2 does (the encoder's weights and "
        "tokenizer, new task heads), with a span model's count head pinned so that it extracts; pass the output "
        "directory to `train --model`.",
    )
    parser.add_argument(
        "--encoder", required=True, help="a local encoder directory (config.json, weights, tokenizer) or a HF id"
    )
    parser.add_argument("--architecture", required=True, choices=("span", "boundary"), help="the GLiNER2 head")
    parser.add_argument("--out", required=True, help="a new (or empty) directory for the model")
    parser.add_argument("--seed", type=non_negative, default=0, help="seed of the heads' initialisation (default 0)")
    parser.add_argument("--json", action="store_true", help="print what was built as JSON")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    import dataclasses

    from prefect_gliner2.runtime.model_init import init_model

    result = init_model(args.encoder, args.architecture, args.out, seed=args.seed)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=1))
    else:
        print(result.describe())
        print(
            f"train it with its recipe (rates, warmup, epochs): prefect-gliner2 train --model {result.out} "
            "--recipe from-encoder ..."
        )
    return 0
