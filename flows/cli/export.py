"""``prefect-gliner2 export --format onnx``: a model as the directory the gliner2-onnx runtime loads, published only
when the parity gate passes on a golden set (``runtime/onnx_publish.py``); ``--check`` runs the gate again on an
existing export.

    prefect-gliner2 export --model ./export --format onnx --precision fp32 int8 --data valid.jsonl --out ./onnx
    prefect-gliner2 export --model ./registry/ner@v000002 --format onnx --data valid.jsonl --out ./ner-v2-onnx
    prefect-gliner2 export --model ./export --format onnx --data valid.jsonl --out ./onnx --check

Exit status: 0 published (or checked), 1 refused by the parity gate (the figures are printed), 2 bad arguments or
something the runtime cannot run (said before any work).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefect_gliner2.flows.cli.args import non_negative, threshold
from prefect_gliner2.session_core.onnx_scope import PRECISIONS

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "export",
        help="export a model to ONNX for the gliner2-onnx runtime, behind a parity gate on gold records",
        description="Write the model as a gliner2-onnx model directory (GLiNER2ONNXRuntime(DIR, precision=P)) with "
        "its thresholds, schema and provenance; every precision must extract what the torch model extracts on the "
        "gold records (fp32: the same spans, confidences within 1e-4; fp16/int8: micro F1 within 0.01), else "
        "nothing is published. Span models and entity tasks only.",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="an export or gliner2 model directory, a registry version ROOT/NAME@v000002 (or ROOT/NAME: CURRENT; "
        "its lineage records the export), a Hugging Face id or tiny:span",
    )
    parser.add_argument("--format", required=True, choices=("onnx",), help="the export format (onnx)")
    parser.add_argument(
        "--precision", nargs="+", choices=PRECISIONS, default=["fp32"], help="precisions to export (default fp32)"
    )
    parser.add_argument("--out", required=True, help="a new directory (or fsspec URL) for the export")
    parser.add_argument(
        "--data",
        required=True,
        help="gold records (training-format JSONL) the parity gate extracts: the run's validation records or any "
        "golden set",
    )
    parser.add_argument(
        "--threshold", type=threshold, help="one threshold for every label (default: the model's fitted ones)"
    )
    parser.add_argument("--seed", type=non_negative, default=0, help="seed of the gate's label orders (default 0)")
    parser.add_argument("--check", action="store_true", help="run the parity gate on the existing export at --out")
    parser.add_argument("--json", action="store_true", help="print the export's record (onnx_export.json) as JSON")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.runtime.onnx_publish import check_onnx, export_onnx
    from prefect_gliner2.session_core.errors import ParityError

    try:
        if args.check:
            reports = check_onnx(args.out, args.model, args.data, seed=args.seed)
            print(f"{args.out}: the parity gate passed against {args.model}")
            for report in reports:
                print(f"  {report.summary()}")
            return 0
        print(f"exporting {args.model} to ONNX ({', '.join(args.precision)}) ...", file=sys.stderr)
        record = export_onnx(args.model, args.out, args.data, args.precision, threshold=args.threshold, seed=args.seed)
    except ParityError as exc:
        print(f"prefect-gliner2 export: refused: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, indent=1))
        return 0
    print(describe(args.out, record))
    return 0


def describe(out: str, record: dict[str, Any]) -> str:
    """Where the export is, how to load it, and each precision's parity figures."""
    precisions = record["precisions"]
    lines = [f"wrote the ONNX export of {record['source']['model']} to {out} ({', '.join(precisions)})"]
    for entry in precisions.values():
        parity = entry["parity"]
        lines.append(
            f"  {parity['precision']}: span agreement {parity['span_agreement']:.4f}, max |score diff| "
            f"{parity['max_score_diff']:.2e}, micro F1 {parity['f1_onnx']:.4f} vs torch {parity['f1_torch']:.4f} "
            f"({parity['f1_diff']:+.4f}) on {parity['records']} gold records: passed ({parity['rule']})"
        )
    first = next(iter(precisions))
    lines.append(f"  load: GLiNER2ONNXRuntime({out!r}, precision={first!r}); or prefect-gliner2 extract --runtime onnx")
    return "\n".join(lines)
