"""Argument helpers shared by the commands: value types, the data arguments, and the input checks that run before
anything starts."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from prefect_gliner2.flows.cli.format_args import format_arguments, read_files

__all__ = [
    "UsageError",
    "check_storage",
    "data_arguments",
    "inputs",
    "non_negative",
    "one",
    "positive",
    "threshold",
]


class UsageError(Exception):
    """A command-line argument is wrong; exit 2 with this message."""


def data_arguments(parser: argparse.ArgumentParser, *, config_required: bool) -> None:
    """--model, --train (repeatable), --valid (repeatable), --config, --recipe and the data format arguments."""
    from prefect_gliner2.session_core.recipes import RECIPES

    parser.add_argument("--model", required=True, help="model directory, Hugging Face id, or tiny:span / tiny:boundary")
    parser.add_argument(
        "--train", required=True, action="append", help="training data path or URL, in any --format (repeatable)"
    )
    parser.add_argument("--valid", action="append", help="validation data path or URL, in any --format (repeatable)")
    config_help = "TrainingConfig fields as a JSON or YAML file"
    if not config_required:
        config_help += " (default: the documented defaults; precision chosen for the device when the file names none)"
    parser.add_argument("--config", required=config_required, help=config_help)
    parser.add_argument(
        "--recipe",
        choices=list(RECIPES),
        help="learning rates, warmup and epochs for where the model starts (replaces the config's recipe): gliner2 to "
        "continue a trained GLiNER2 model, from-encoder for a model built by init-model (fresh heads)",
    )
    format_arguments(parser)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def auto_or(number: Any) -> Any:
    """An argument type: "auto", or what `number` accepts."""

    def parse(text: str) -> int | str:
        return "auto" if text == "auto" else number(text)

    parse.__name__ = f"auto or {number.__name__}"
    return parse


def threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def one(paths: list[str] | None) -> str | list[str] | None:
    """A repeatable path argument as the flows take it: one path, a list of paths, or None."""
    return paths[0] if paths and len(paths) == 1 else paths


def inputs(args: Any) -> tuple[Any, Any, Any]:
    """Check the model, config and data files before anything starts; returns (config, train, valid) as the
    planner takes them (a path, a list of paths, None, or the records converted from another format). Without
    --config (or with one that names no precision) the first line printed says which precision was chosen."""
    import fsspec

    from prefect_gliner2.flows.cli.first_run import training_config
    from prefect_gliner2.runtime.model_sources import check_model_source

    check_model_source(args.model)
    for role, paths in (("training", args.train), ("validation", args.valid or [])):
        for path in paths:
            fs, local = fsspec.core.url_to_fs(path)
            if not fs.exists(local):
                raise UsageError(f"{role} data {path!r} does not exist; pass a data file path or URL")
    config, chosen = training_config(args.config, getattr(args, "device", None))
    if chosen:
        print(f"prefect-gliner2 {args.command}: {chosen}", file=sys.stderr)
    if getattr(args, "recipe", None):
        config = config.replace(recipe=args.recipe)
    if getattr(args, "storage", None):
        check_storage(args.storage)
    train, valid = read_files(args.train, args, "training"), read_files(args.valid, args, "validation")
    return config, one(train) if isinstance(train, list) else train, one(valid) if isinstance(valid, list) else valid


def check_storage(storage: str) -> None:
    """A local storage path must be (or be creatable as) a directory: find out before a flow run starts."""
    from prefect_gliner2.session_core.storage import is_local, resolve

    fs, path = resolve(storage)
    if not is_local(fs):
        return
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        raise UsageError(
            f"--storage {storage!r} cannot hold run directories ({probe!r} is not a writable directory); "
            "pass a writable directory or fsspec URL"
        )
