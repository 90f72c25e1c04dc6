"""``prefect-gliner2 convert``: annotation files (CoNLL/BIO, spaCy, Label Studio, doccano) into gliner2 records,
one JSON record per line, every mention a ``{"text", "start", "end"}`` span. Training on the output plans exactly
the run that training on the inputs with ``--format`` plans (the same records, the same plan fingerprint)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from prefect_gliner2.flows.cli.format_args import format_arguments, format_options

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "convert", help="convert CoNLL/BIO, spaCy, Label Studio or doccano files into gliner2 training records"
    )
    parser.add_argument("inputs", nargs="+", metavar="IN", help="annotation file(s), paths or URLs")
    parser.add_argument("--out", required=True, help="the records JSONL to write (path or URL; replaced whole)")
    format_arguments(parser, flag="--from")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.flows.cli.args import UsageError
    from prefect_gliner2.session_core.records import read_data
    from prefect_gliner2.session_core.storage import absolute_uri, atomic_file

    out = absolute_uri(args.out)
    if out in {absolute_uri(path) for path in args.inputs}:
        raise UsageError(f"--out {args.out} is also an input; write the records to another file")
    reading = read_data(args.inputs, format=args.data_format, options=format_options(args), what="converted")
    for line in reading.files:
        print(line, file=sys.stderr)
    records = reading.records
    parent = os.path.dirname(out) if "://" not in out else ""
    if parent:
        os.makedirs(parent, exist_ok=True)
    with atomic_file(out) as handle:
        for row in range(len(records)):
            handle.write((records.canonical(row) + "\n").encode("utf-8"))
    labels = list(records.example(0)["output"].get("entities", {})) if len(records) else []
    print(f"wrote {len(records)} record(s) to {out}; entity labels: {', '.join(labels) or 'none'}")
    return 0
