"""The demo under other training settings: `prefect-gliner2 demo`'s run with some DEMO_CONFIG fields replaced, its
exported model scored on the held-out records at the thresholds it ships, in 8 seeded label orders: micro F1 range
and each label's lowest F1 over the orders. How the label-subset default (0.5) was chosen:

    .venv/bin/python bench/demo_variants.py '{"label_subset_prob": 0.0}' '{"label_subset_prob": 0.5}' \\
        '{"label_subset_prob": 1.0}'

Each variant runs in its own directory under --work (default: a new temporary one), one after the other (never two
at once on 2 cores: their torch threads would oversubscribe them). About 1 minute each on 2 quiet cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="JSON objects of DEMO_CONFIG fields to replace")
    parser.add_argument("--work", help="working directory (default: a new temporary one)")
    args = parser.parse_args()
    from prefect_gliner2.flows import demo
    from prefect_gliner2.session_core.evaluation import label_f1_order_min, order_reports
    from prefect_gliner2.session_core.pairs import to_pairs
    from prefect_gliner2.session_core.records import load_records
    from prefect_gliner2.session_core.thresholds import read_thresholds
    from prefect_gliner2.training.inference import model_extractor
    from prefect_gliner2.training.weights import load_exported_model

    work = Path(args.work or tempfile.mkdtemp(prefix="demo-variants-"))
    base = dict(demo.DEMO_CONFIG)
    for index, variant in enumerate(args.variants):
        overrides = json.loads(variant)
        demo.DEMO_CONFIG.clear()
        demo.DEMO_CONFIG.update({**base, **overrides})
        start = time.perf_counter()
        out = demo.run_demo(str(work / f"variant-{index}"))
        wall = time.perf_counter() - start
        export = str(out["export"])
        extract = model_extractor(load_exported_model(export), threshold=read_thresholds(export), batch_size=32)
        pairs = to_pairs(load_records(out["demo"]["test_data"], what="held-out").examples())
        reports, _ = order_reports(pairs, extract, seed=int(demo.DEMO_CONFIG["seed"]), trials=demo.DEMO_ORDERS)
        micro = [report.metrics()["eval_f1"] for report in reports]
        lowest = ", ".join(f"{name} {f1:.3f}" for name, f1 in label_f1_order_min(reports).items())
        spread = f"{min(micro):.3f}-{max(micro):.3f}"
        print(f"{json.dumps(overrides)}: {wall:.0f} s, micro F1 {spread}; each label's lowest F1 {lowest}")


if __name__ == "__main__":
    main()
