"""``prefect-gliner2 evaluate``: precision, recall, F1 and support per label of a model's extractions on gold
records, then the totals, with gliner2's own batched inference, in this process."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from prefect_gliner2.flows.cli.args import UsageError, one, positive, threshold

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "evaluate", help="precision, recall and F1 of a model's extractions on gold records"
    )
    parser.add_argument("--model", required=True, help="an exported model directory (or tiny:span, a Hugging Face id)")
    parser.add_argument("--data", required=True, action="append", help="gold JSONL path or URL (repeatable)")
    parser.add_argument(
        "--threshold",
        type=threshold,
        default=None,
        help="one span threshold in [0, 1] for every label (default: the thresholds fitted on the model's validation "
        "data, recorded in its export.json; 0.5 for a model without them)",
    )
    parser.add_argument("--batch-size", type=positive, default=8, help="texts per inference batch (default 8)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of each record's random label order (default 0; see --orders)"
    )
    parser.add_argument(
        "--orders",
        type=positive,
        default=4,
        help="ask each record's labels in this many seeded random orders and report the F1 spread; the first "
        "order's scores are the report's (default 4). The data set's own order is reported too (eval_f1_canonical)",
    )
    parser.add_argument("--json", dest="json_out", help="also write the report (metrics, totals, per label) here")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    import fsspec

    from prefect_gliner2.runtime.model_sources import check_model_source
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records

    check_model_source(args.model)
    for path in args.data:
        fs, local = fsspec.core.url_to_fs(path)
        if not fs.exists(local):
            raise UsageError(f"data {path!r} does not exist; pass a JSONL file of gold records (path or URL)")
    pairs = to_pairs(load_records(one(args.data), what="evaluation").examples())
    if args.json_out and os.path.isdir(args.json_out):
        raise UsageError(f"--json {args.json_out!r} is a directory; pass a file path for the JSON report")
    chosen, source = _thresholds(args.model, args.threshold)
    report, order = _score_model(
        args.model, pairs, threshold=chosen, batch_size=args.batch_size, seed=args.seed, orders=args.orders
    )
    payload = {"model": args.model, "data": args.data, "threshold": chosen.threshold, **report.to_dict()}
    payload["thresholds"] = {"source": source, **chosen.to_dict()}
    payload["label_order"] = {"seed": args.seed, "orders": args.orders, **order}
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
    print(_report_table(payload))
    return 0


def _thresholds(source: str, explicit: float | None) -> tuple[Any, str]:
    """The model's recorded (fitted) thresholds unless the user passed one; gliner2's 0.5 for a model without."""
    from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, fixed, read_thresholds

    if explicit is not None:
        return fixed(explicit), "explicit"
    directory = os.path.expanduser(source)
    recorded = read_thresholds(directory) if os.path.isdir(directory) else None
    return (recorded, "fitted") if recorded is not None else (fixed(DEFAULT_THRESHOLD), "default")


def _score_model(
    source: str, pairs: list[Any], *, threshold: Any, batch_size: int, seed: int, orders: int
) -> tuple[Any, dict[str, float]]:
    from prefect_gliner2.session_core.evaluation import order_robustness
    from prefect_gliner2.training.inference import model_extractor

    model = _load_for_evaluation(source)
    extract = model_extractor(model, threshold=threshold, batch_size=batch_size)
    return order_robustness(pairs, extract, seed=seed, trials=orders)


def _load_for_evaluation(source: str) -> Any:
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training.weights import load_exported_model

    directory = os.path.expanduser(source)
    if os.path.isdir(directory):
        if not os.path.isfile(os.path.join(directory, "config.json")):
            raise UsageError(
                f"--model {source!r} has no config.json: pass a directory written by export (or save_pretrained)"
            )
        return load_exported_model(directory)
    return load_model(source)


def _report_table(report: dict[str, Any]) -> str:
    """Per-label precision, recall, F1 and support, then the totals."""
    from prefect_gliner2.session_core.thresholds import describe

    rows = [(r["kind"], r["label"], r) for r in report["per_label"]]
    width = max([len(f"{k}/{label}") for k, label, _ in rows] + [len("all (micro)")])
    head = f"{'label':<{width}}  precision  recall      F1  support"

    def line(name: str, row: dict[str, Any]) -> str:
        return f"{name:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:6.4f}  {row['support']:7d}"

    lines = [head, *(line(f"{k}/{label}", r) for k, label, r in rows), "-" * len(head)]
    lines.append(line("all (micro)", report["total"]))
    metrics = report["metrics"]
    lines.append(
        f"macro F1 {metrics['eval_macro_f1']:.4f} over {len(rows)} label(s); {report['records']} records; "
        f"tp {report['total']['tp']}, fp {report['total']['fp']}, fn {report['total']['fn']}"
    )
    thresholds = dict(report["thresholds"])
    source = thresholds.pop("source")
    where = {"fitted": "the model's own", "explicit": "--threshold", "default": "gliner2's default"}[source]
    lines.append(f"{describe(thresholds)} ({where})")
    order = report["label_order"]
    lines.append(
        f"labels asked in a seeded random order per record (seed {order['seed']}); micro F1 over {order['orders']} "
        f"orders {order['eval_f1_order_min']:.4f}-{order['eval_f1_order_max']:.4f}, in the data's own order "
        f"{order['eval_f1_canonical']:.4f}"
    )
    return "\n".join(lines)
