"""Benchmark: plan + manifest cost for 10k / 100k / 1M synthetic records, each size in a fresh process.

Usage: python bench/plan.py [--sizes 10000,100000,1000000] [--epochs 3] [--source dicts|jsonl]

Per size it prints the seconds of each stage (loading + validating records into a plan; the streaming
``manifest_bytes``; ``to_manifest`` plus ``dumps_manifest`` to bytes, the dict path), the peak resident-memory
growth over the synthetic input (``ru_maxrss`` delta): peak1 after plan + ``manifest_bytes``, peak2 after the dict
path too, and per-record ratios of total time and peak2 against the smallest size (near 1.0: linear growth).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
    "the a of in on at to from with for by and or but company city river people market report said today "
    "yesterday new old first last government bank school university hospital team season game project board "
    "meeting announced opened visited signed joined led founded moved returned"
).split()
PEOPLE = [
    "John Smith",
    "Maria Garcia",
    "Wei Chen",
    "Aisha Khan",
    "Lars Berg",
    "Ana Souza",
    "Kenji Sato",
    "Olga Ivanova",
]
PLACES = ["Paris", "Nairobi", "Lima", "Oslo", "Osaka", "Toronto", "Cairo", "Hanoi", "Munich", "Austin"]


def synthetic_records(n: int, seed: int = 0) -> list[dict]:
    """Realistic small native records: a 10-20 word sentence with one or two entities."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        person, place = rng.choice(PEOPLE), rng.choice(PLACES)
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        words.insert(rng.randrange(len(words) + 1), person)
        entities: dict[str, list[str]] = {"person": [person]}
        if rng.random() < 0.5:
            words.insert(rng.randrange(len(words) + 1), place)
            entities["location"] = [place]
        records.append({"input": " ".join(words).capitalize() + ".", "output": {"entities": entities}})
    return records


def _maxrss_mb() -> float:
    divisor = 1024 * 1024 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / divisor


def write_jsonl(n: int, path: str) -> None:
    """Write the synthetic records as JSONL (in a helper process: a child inherits its parent's peak RSS)."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in synthetic_records(n))


def measure(n: int, epochs: int, jsonl: str | None) -> dict:
    """Run in a fresh process: build the input, then time planning and manifests."""
    sys.path.insert(0, ROOT)
    from prefect_gliner2.session_core.config import TrainingConfig
    from prefect_gliner2.session_core.manifest import dumps_manifest
    from prefect_gliner2.session_core.plan import ManagedTrainingPlan

    examples: object = jsonl if jsonl else synthetic_records(n)
    config = TrainingConfig(fp16=False, bf16=False, batch_size=8, gradient_accumulation_steps=2, num_epochs=epochs)
    base = _maxrss_mb()
    t0 = time.perf_counter()
    plan = ManagedTrainingPlan(examples, config, architecture="boundary")
    t1 = time.perf_counter()
    streamed = plan.manifest_bytes()
    t2 = time.perf_counter()
    del streamed
    streamed_peak = _maxrss_mb() - base
    manifest = plan.to_manifest()
    data = dumps_manifest(manifest)
    t3 = time.perf_counter()
    return {
        "n": n,
        "plan_s": t1 - t0,
        "manifest_bytes_s": t2 - t1,
        "to_manifest_dumps_s": t3 - t2,
        "total_s": t3 - t0,
        "streamed_peak_mb": streamed_peak,
        "peak_growth_mb": _maxrss_mb() - base,
        "manifest_mb": len(data) / 1e6,
        "batches": plan.batch_count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--source", choices=("dicts", "jsonl"), default="dicts")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--jsonl", help=argparse.SUPPRESS)
    parser.add_argument("--write-jsonl", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_jsonl:
        write_jsonl(args.write_jsonl, args.jsonl)
        return
    if args.child:
        print(json.dumps(measure(args.child, args.epochs, args.jsonl)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"plan + manifest, batch_size 8, accumulation 2, {args.epochs} epochs, boundary (length-grouped), "
        f"input from {args.source}; {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(
        f"{'records':>9} {'plan s':>7} {'bytes s':>8} {'dict+dumps s':>12} {'total s':>8} {'peak1 MB':>8} "
        f"{'peak2 MB':>8} {'file MB':>8} {'us/rec':>7} {'time x':>7} {'mem x':>6}"
    )
    first = None
    for n in sizes:
        command = [sys.executable, __file__, "--child", str(n), "--epochs", str(args.epochs)]
        jsonl = None
        if args.source == "jsonl":
            jsonl = os.path.join(tempfile.mkdtemp(), f"synthetic-{n}.jsonl")
            subprocess.run([sys.executable, __file__, "--write-jsonl", str(n), "--jsonl", jsonl], check=True)
        try:
            out = subprocess.run(
                command + (["--jsonl", jsonl] if jsonl else []), check=True, capture_output=True, text=True
            )
        finally:
            if jsonl:
                os.unlink(jsonl)
                os.rmdir(os.path.dirname(jsonl))
        r = json.loads(out.stdout.strip().splitlines()[-1])
        first = first or r
        time_ratio = (r["total_s"] / n) / (first["total_s"] / first["n"])
        mem_ratio = (
            (r["peak_growth_mb"] / n) / (first["peak_growth_mb"] / first["n"])
            if first["peak_growth_mb"]
            else float("nan")
        )
        print(
            f"{n:>9} {r['plan_s']:>7.2f} {r['manifest_bytes_s']:>8.2f} {r['to_manifest_dumps_s']:>12.2f} "
            f"{r['total_s']:>8.2f} {r['streamed_peak_mb']:>8.0f} {r['peak_growth_mb']:>8.0f} {r['manifest_mb']:>8.1f} "
            f"{1e6 * r['total_s'] / n:>7.1f} {time_ratio:>7.2f} {mem_ratio:>6.2f}"
        )


if __name__ == "__main__":
    main()
