"""``prefect-gliner2 compare``: would model B replace model A? The retraining flow's promotion decision, by hand.

    prefect-gliner2 compare --a registry/ner/versions/v000002 --b runs/nightly/export --data test.jsonl \\
        [--guard old-train.jsonl] [--base tiny:span] [--margin 0.01] [--json decision.json]

A is the current model, B the candidate. Both (and the base model, with ``--base``) are scored on the same records
under the same conditions (runtime/compare.py: the same seeded label order per record, each model with the
thresholds its export.json records, else ``--threshold``), in this process; the rule (session_core/promotion.py)
decides from a seeded paired bootstrap. Prints the decision, the F1s with their intervals and the label table;
``--json`` also writes the scores and the decision. Exits 0 whatever the verdict (it is in the output).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from prefect_gliner2.flows.cli.args import UsageError, positive, threshold
from prefect_gliner2.session_core.promotion_report import decision_text
from prefect_gliner2.session_core.promotion_rule import PromotionRule

__all__ = ["add_parser", "run"]

DATA, GUARD = "data", "guard"  # the set names in the decision and the JSON
# rule setting -> (flag, type, help)
RULE_FLAGS: dict[str, tuple[str, Any, str]] = {
    "margin": ("--margin", float, "promote when the interval of (B F1 - A F1) lies above this (default 0)"),
    "confidence": ("--confidence", float, "confidence level of every interval (default 0.95)"),
    "resamples": ("--resamples", int, "paired bootstrap resamples of whole records (default 2000)"),
    "seed": ("--bootstrap-seed", int, "the bootstrap's seed (default 0)"),
    "method": ("--method", str, "interval method: percentile (default), basic or BCa"),
    "min_support": ("--min-support", int, "labels with fewer gold items are shown, not judged (default 10)"),
    "max_label_drop": ("--max-label-drop", float, "F1 a label may lose before a clear drop rejects (default 0.05)"),
    "min_vanish_support": ("--min-vanish-support", int, "a label A finds may not vanish from this support (1)"),
    "max_guard_drop": ("--max-guard-drop", float, "micro F1 the guard set may lose (default 0.05)"),
}


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "compare", help="would model B replace model A? the retraining flow's promotion decision on your data"
    )
    parser.add_argument("--a", required=True, help="model A, the current one: an export or registry version directory")
    parser.add_argument("--b", required=True, help="model B, the candidate: an export or registry version directory")
    parser.add_argument("--data", required=True, action="append", help="gold JSONL to compare on (repeatable)")
    parser.add_argument("--guard", action="append", help="a retention set B may not regress on (repeatable)")
    parser.add_argument("--base", help="also score this base model beside them (shows what fine-tuning forgot)")
    parser.add_argument(
        "--threshold",
        type=threshold,
        default=0.5,
        help="threshold of a model whose export records none (default 0.5; recorded thresholds are used as they are)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of each record's random label order (default 0)")
    parser.add_argument("--batch-size", type=positive, default=8, help="texts per inference batch (default 8)")
    for flag, kind, text in RULE_FLAGS.values():
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument("--json", dest="json_out", help="also write the scores and the decision here")
    parser.set_defaults(handler=run)


def run(args: Any) -> int:
    from prefect_gliner2.runtime.compare import BASE, CANDIDATE, CURRENT, decide_from_scores, score_exports_here

    rule = _rule(args)
    models = {CURRENT: args.a, CANDIDATE: args.b, **({BASE: args.base} if args.base else {})}
    _check_inputs(args, list(models.values()))
    data: dict[str, str | list[str]] = {DATA: args.data, **({GUARD: args.guard} if args.guard else {})}
    scores = score_exports_here(
        models, data, seed=args.seed, fallback_threshold=args.threshold, batch_size=args.batch_size
    )
    decision = decide_from_scores(scores, rule, test=DATA, guard=GUARD if args.guard else None)
    print(_header(args, scores[DATA]) + decision_text(decision), end="")
    if args.json_out:
        from prefect_gliner2.runtime.compare import metrics_only

        payload = {
            "a": args.a,
            "b": args.b,
            "base": args.base,
            "data": args.data,
            "guard": args.guard,
            "label_order_seed": args.seed,
            "scores": {name: metrics_only(roles) for name, roles in scores.items()},
            "decision": decision.to_dict(),
        }
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
    return 0


def _rule(args: Any) -> PromotionRule:
    """The rule from the flags given (the others keep the rule's defaults); a bad value is a usage error."""
    chosen = {name: getattr(args, flag[2:].replace("-", "_")) for name, (flag, _, _) in RULE_FLAGS.items()}
    return PromotionRule.from_dict({name: value for name, value in chosen.items() if value is not None})


def _check_inputs(args: Any, models: list[str]) -> None:
    import fsspec

    from prefect_gliner2.runtime.model_sources import check_model_source

    for source in models:
        check_model_source(source)
    for path in [*args.data, *(args.guard or [])]:
        fs, local = fsspec.core.url_to_fs(path)
        if not fs.exists(local):
            raise UsageError(f"data {path!r} does not exist; pass a JSONL file of gold records (path or URL)")
    if args.json_out and os.path.isdir(args.json_out):
        raise UsageError(f"--json {args.json_out!r} is a directory; pass a file path for the JSON report")


def _header(args: Any, scores: dict[str, Any]) -> str:
    """Which model is which, and the thresholds each one was asked with."""
    from prefect_gliner2.runtime.compare import BASE, CANDIDATE, CURRENT

    lines = []
    for role, name in ((CURRENT, "A (current)"), (CANDIDATE, "B (candidate)"), (BASE, "base")):
        if role in scores:
            thresholds = scores[role]["thresholds"]
            per_label = sum(len(thresholds[kind]) for kind in ("entities", "relations", "fields"))
            extra = f" + {per_label} per-label" if per_label else ""
            where = scores[role]["thresholds_from"]
            lines.append(f"{name}: {scores[role]['uri']} (threshold {thresholds['threshold']:g}{extra}, {where})")
    order = f"labels asked in a seeded random order per record (seed {args.seed})"
    return "\n".join(lines) + f"\n{order}\n\n"
