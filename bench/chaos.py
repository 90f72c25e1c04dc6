"""Chaos benchmark: SIGKILL the training flow at seeded random moments, resume, and compare bit for bit.

    python bench/chaos.py                 # span/boundary x full/LoRA, every kill kind, storage faults
    python bench/chaos.py --quick         # boundary full + span LoRA, a couple of kills (as tests/test_chaos.py)
    python bench/chaos.py --json out.json # also write the report as JSON

A thin command line over the chaos engine in tests/support/chaos.py (what is killed when, what is compared, the
storage faults: see its docstring). Without ``--api-url`` a throwaway local Prefect server is started
(``prefect_test_harness``). Exit status 0 when no bit differs and the histories are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # bench/ may import test support

from support.chaos import CASES, format_report, prefect_server, run_chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="two cases, a couple of kills, no storage faults")
    parser.add_argument("--seed", type=int, default=0, help="chooses the kill moments")
    parser.add_argument("--cases", help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--storage-faults", choices=("on", "off"), help="default: on, off with --quick")
    parser.add_argument("--api-url", help="an existing Prefect API (default: a throwaway local server)")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("OMP_NUM_THREADS", "1"),
        ("PREFECT_LOGGING_LEVEL", "WARNING"),
    ):
        os.environ.setdefault(name, value)
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="chaos-prefect-home-"))
    faults = None if args.storage_faults is None else args.storage_faults == "on"
    with tempfile.TemporaryDirectory(prefix="chaos-") as work, prefect_server(args.api_url) as url:
        report = run_chaos(
            quick=args.quick,
            seed=args.seed,
            api_url=url,
            work=Path(work),
            cases=args.cases.split(",") if args.cases else None,
            faults=faults,
        )
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report["differing_bits"] == 0 and report["histories_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
