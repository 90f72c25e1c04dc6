"""Console script ``prefect-gliner2``: train, plan, demo and evaluate from a terminal; one module per command.

    prefect-gliner2 train --model DIR_OR_ID --train FILE [--valid FILE] [--config FILE] [--format FORMAT] \\
                          [--run-key KEY] [--storage DIR_OR_URL] [--export DIR]
    prefect-gliner2 convert IN... --from FORMAT --out OUT.jsonl
    prefect-gliner2 tune  --model DIR_OR_ID --train FILE --valid FILE --config FILE --space SPACE.yaml --trials N \\
                          [--parallel K --deployment] [--study-key KEY] [--storage OPTUNA_URL]
    prefect-gliner2 plan  --model DIR_OR_ID --train FILE [--valid FILE] --config FILE [--out manifest.json]
    prefect-gliner2 demo  [--dir DIR]
    prefect-gliner2 evaluate --model DIR --data FILE [--threshold T] [--json OUT]
    prefect-gliner2 extract --model DIR_OR_REGISTRY --data IN.jsonl --out OUT [--labels A,B] [--threshold T] \\
                            [--format jsonl|label-studio|spacy|conll|doccano|spacy-jsonl]
    prefect-gliner2 init-model --encoder DIR_OR_ID --architecture span|boundary --out DIR
    prefect-gliner2 compare --a MODEL --b MODEL --data FILE [--guard FILE] [--json OUT]
    prefect-gliner2 export --model MODEL --format onnx [--precision fp32 int8] --data GOLD --out DIR [--check]

``train`` plans the run and records its manifest in the run directory, then runs the training flow on that run key
through Prefect: against PREFECT_API_URL when set, else a local server the command starts and stops (``server``).
Re-running the same command after a crash resumes exactly. Data files may be in any annotation format (CoNLL/BIO,
spaCy DocBin or JSONL, Label Studio, doccano: ``--format``, detected by default), and without ``--config`` the
documented defaults train, with the precision chosen for the device and said in the first line; ``convert`` writes
the records such files hold (``session_core.formats``). ``tune`` runs an Optuna study whose trials are training runs
(pruned ones paused at a checkpoint, continuable); the same command after a crash continues the study. Bad arguments
exit with status 2 and a message saying what to fix; a failed run exits with 1; Ctrl-C or SIGTERM records the run as
crashed and exits with 130 or 143 and the resume hint (``interrupts``). ``evaluate`` scores a model's extractions on
gold records (per-label precision, recall, F1 and support, then the totals) with gliner2's own batched inference, in
this process. ``extract`` writes a model's extractions for a JSONL file of texts, resumably (the same command after
a kill continues where it stopped). ``compare`` decides whether model B would replace model A by the retraining
flow's promotion rule (paired bootstrap intervals, per-label and guard-set checks), in this process. ``export`` writes a
model as an ONNX directory for the gliner2-onnx runtime, published only when its parity gate passes on gold records.

A command is a module here with ``add_parser(commands)`` (its arguments, and ``handler`` set to its ``run(args)``,
which returns the exit status); ``COMMANDS`` lists them in the order ``--help`` shows.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from prefect_gliner2.flows.cli import compare, convert, demo, evaluate, export, extract, init_model, plan, train, tune
from prefect_gliner2.flows.cli.args import UsageError
from prefect_gliner2.flows.cli.interrupts import exit_now, exit_status, handling_signals, report_interrupt
from prefect_gliner2.flows.cli.server import LocalServerError
from prefect_gliner2.session_core.errors import SessionCoreError

__all__ = ["COMMANDS", "INTERRUPTED", "USAGE_ERROR", "console_main", "main"]

USAGE_ERROR = 2
INTERRUPTED = (128 + signal.SIGINT, 128 + signal.SIGTERM)
COMMANDS = (train, tune, convert, plan, demo, evaluate, compare, extract, export, init_model)


def console_main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``prefect-gliner2`` console script: ``main``, then exit with its status (at once after an interrupt)."""
    status = main(argv)
    if status in INTERRUPTED:
        exit_now(status)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with handling_signals():
            return int(args.handler(args))
    except (UsageError, SessionCoreError) as exc:
        print(f"prefect-gliner2 {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except LocalServerError as exc:
        print(f"prefect-gliner2 {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:
        status = exit_status(exc)
        if status is None:
            raise
        report_interrupt()
        return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefect-gliner2", description="Exact, resumable GLiNER2 fine-tuning on Prefect."
    )
    names = ",".join(command.__name__.rsplit(".", 1)[-1].replace("_", "-") for command in COMMANDS)
    commands = parser.add_subparsers(dest="command", required=True, metavar=f"{{{names}}}")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser
