"""Which per-label threshold fit generalises to held-out records: fitted on validation, scored on unseen records.

    python bench/threshold_shrinkage.py [--out /tmp/thr-bench] [--seeds 1 2] [--epochs 1 2 4] [--repeats 8] \
        [--models tiny:span:64x2:deberta tiny:span:64x2] [--checkpoints DEMO/runs/demo/checkpoints/step-...]

Models: the demo's tiny span models (a DeBERTa-style and a BERT-style encoder, ``tiny:span:64x2[:deberta]``) trained
with the demo's config (for the last of ``--epochs`` epochs) on 300 generated records, one per ``--seeds`` value,
and snapshotted after each of ``--epochs`` (early snapshots are the badly calibrated models where thresholds matter
most). Each snapshot extracts a validation pool (200 records) and a held-out set (200 records) once, at the fit's
floor with confidences, each record's labels in its seeded shuffled order; the extractions are cached under
``--out`` (delete it to retrain). ``--checkpoints`` adds snapshots of finished ``prefect-gliner2 demo`` runs (their
weights in the demo's model, extracted the same way): the well-trained end of the range.

Then, per snapshot, for validation sets of 20, 40 and 100 records (``--repeats`` seeded draws from the pool), every
fitting rule below fits thresholds on the validation set and the held-out set is scored at them. Printed per rule
and validation size: mean held-out micro F1, macro F1 (over labels with gold), the worst label's F1, and how many
(snapshot, draw, label) cases with held-out gold scored 0; then the same means per snapshot for the chosen rule.

Rules (each but ``micro-old`` ends with the product's guard: a label with gold whose F1 is 0 at its value gets its
own best value when that scores more):

- ``micro-old``: the old rule, no guard: each label with >= 10 gold items gets the value that maximises micro F1
  with the others held;
- ``micro``: the same with the guard;
- ``own-m``: each label with >= m gold items gets the value that maximises its own F1, the others the global one;
- ``blend-k``: the own value and the global value averaged with weight n / (n + k) on the own one (n: the label's
  gold items), snapped to the grid;
- ``crossfit``: the product's rule (``session_core/threshold_fit.py``): a label with gold items gets its own value
  when that beats the global value on the other half in two-fold cross-fitting; ``crossfit-10`` only from 10 items;
- ``oracle``: own values fitted on the held-out set itself (an upper bound).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from prefect_gliner2.session_core.label_order import SHUFFLED, extraction_schemas  # noqa: E402
from prefect_gliner2.session_core.pairs import to_pairs  # noqa: E402
from prefect_gliner2.session_core.threshold_fit import (  # noqa: E402
    best_index,
    fit_table,
    guarded,
    micro_f1,
)
from prefect_gliner2.session_core.threshold_table import (  # noqa: E402
    FLOOR,
    GRID,
    KIND_OF,
    ThresholdTable,
)
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, Thresholds  # noqa: E402

MODELS = ("tiny:span:64x2:deberta", "tiny:span:64x2")
POOL, HELD_OUT, TRAIN = 200, 200, 300
SIZES = (20, 40, 100)
Fit = Callable[[ThresholdTable], Thresholds]


# ------------------------------------------------------------------------------------------- the extractions


def extractions(
    out: Path, seeds: Sequence[int], epochs: Sequence[int], models: Sequence[str] = MODELS
) -> list[dict[str, Any]]:
    """Per (model, seed, epoch): gold and floor extractions of the validation pool and the held-out set (cached)."""
    snapshots = []
    for source in models:
        for seed in seeds:
            path = out / f"{source.replace(':', '_')}-seed{seed}.json"
            if not path.exists():
                started = time.perf_counter()
                path.write_text(json.dumps(_train_and_extract(source, seed, epochs)))
                print(f"trained and extracted {source} seed {seed} in {time.perf_counter() - started:.0f} s")
            for epoch, data in json.loads(path.read_text()).items():
                if int(epoch) in epochs:
                    snapshots.append({"name": f"{source.split(':')[-1]} s{seed} e{epoch}", **data})
    return snapshots


def checkpoint_extractions(out: Path, checkpoints: Sequence[str]) -> list[dict[str, Any]]:
    """Snapshots from finished runs of the demo (``--checkpoints DIR ...``: its checkpoints, weights loaded into the
    demo's model): the well-trained end of the range, extracted like the others (cached by directory name)."""
    snapshots = []
    for uri in checkpoints:
        name = Path(uri).name
        path = out / f"checkpoint-{name}.json"
        if not path.exists():
            path.write_text(json.dumps(_checkpoint_extract(uri)))
        snapshots.append({"name": f"demo {name.split('-batch')[0]}", **json.loads(path.read_text())})
    return snapshots


def _checkpoint_extract(uri: str) -> dict[str, Any]:
    from prefect_gliner2.flows.demo import DEMO_CONFIG, DEMO_MODEL
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training import TrainingConfig, TrainingSession
    from prefect_gliner2.training.tiny import tiny_records

    seed = int(DEMO_CONFIG["seed"])
    session = TrainingSession(
        load_model(DEMO_MODEL), TrainingConfig(**{**DEMO_CONFIG, "eval_strategy": "no"}), max_steps=1
    )
    try:
        session.load_weights(uri)
        sets = {"valid": tiny_records(POOL, seed=1000 + seed), "test": tiny_records(HELD_OUT, seed=2000 + seed)}
        return {name: _floor(session, records, seed) for name, records in sets.items()}
    finally:
        session.close()


def _train_and_extract(source: str, seed: int, epochs: Sequence[int]) -> dict[str, Any]:
    from prefect_gliner2.flows.demo import DEMO_CONFIG
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training import ManagedTrainingPlan, TrainingConfig, TrainingSession
    from prefect_gliner2.training.tiny import tiny_records

    config = TrainingConfig(**{**DEMO_CONFIG, "seed": seed, "num_epochs": max(epochs), "eval_strategy": "no"})
    plan = ManagedTrainingPlan(tiny_records(TRAIN, seed=seed), config, architecture="span")
    session = TrainingSession(load_model(source), config, max_steps=plan.max_steps)
    sets = {"valid": tiny_records(POOL, seed=1000 + seed), "test": tiny_records(HELD_OUT, seed=2000 + seed)}
    out: dict[str, Any] = {}
    try:
        for i in range(plan.batch_count):
            session.forward_backward(plan.batch(i))
            if plan.is_update(i):
                session.optim_step()
            epoch = plan.epoch(i) + 1
            if plan.is_epoch_end(i) and epoch in epochs:
                out[str(epoch)] = {name: _floor(session, records, seed) for name, records in sets.items()}
    finally:
        session.close()
    return out


def _floor(session: Any, records: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    pairs = to_pairs(records)
    gold = [output for _, output in pairs]
    schemas = extraction_schemas(gold, label_order=SHUFFLED, seed=seed)
    texts = [text for text, _ in pairs]
    predicted = session.extract(texts, schemas, threshold=FLOOR, batch_size=8, include_confidence=True)
    return {"gold": gold, "predicted": predicted}


# ------------------------------------------------------------------------------------------------- the rules


def _global_index(table: ThresholdTable, records: Sequence[int] | None = None) -> int:
    counts = table.counts(records)
    fixed = table.fixed(records)
    scores = [micro_f1(counts, dict.fromkeys(counts, i), fixed) for i in range(len(GRID))]
    return best_index(scores, DEFAULT_THRESHOLD)


def _as_thresholds(table: ThresholdTable, g: int, choice: dict[tuple[str, str], int]) -> Thresholds:
    per_label: dict[str, dict[str, float]] = {kind: {} for kind in KIND_OF.values()}
    for key, i in choice.items():
        if i != g:
            per_label[KIND_OF[key[0]]][key[1]] = GRID[i]
    return Thresholds(threshold=GRID[g], **per_label, fitted=True)


def micro_rule(guard: bool) -> Fit:
    """The old rule: coordinate ascent on micro F1, labels with >= 10 gold items in (kind, label) order."""

    def fit(table: ThresholdTable) -> Thresholds:
        counts, fixed = table.counts(), table.fixed()
        g = _global_index(table)
        choice = dict.fromkeys(counts, g)
        for key in table.labels:
            if counts[key][0].support >= 10:
                scores = [micro_f1(counts, {**choice, key: i}, fixed) for i in range(len(GRID))]
                choice[key] = best_index(scores, GRID[g])
        return _as_thresholds(table, g, guarded(counts, choice) if guard else choice)

    return fit


def own_rule(min_support: int) -> Fit:
    def fit(table: ThresholdTable) -> Thresholds:
        counts = table.counts()
        g = _global_index(table)
        choice = {
            key: best_index([c.f1 for c in counts[key]], GRID[g]) if counts[key][0].support >= min_support else g
            for key in table.labels
        }
        return _as_thresholds(table, g, guarded(counts, choice))

    return fit


def blend_rule(k: float) -> Fit:
    def fit(table: ThresholdTable) -> Thresholds:
        counts = table.counts()
        g = _global_index(table)
        choice = {}
        for key in table.labels:
            n = counts[key][0].support
            own = best_index([c.f1 for c in counts[key]], GRID[g])
            value = (n * GRID[own] + k * GRID[g]) / (n + k)
            choice[key] = min(range(len(GRID)), key=lambda i: (abs(GRID[i] - value), GRID[i]))
        return _as_thresholds(table, g, guarded(counts, choice))

    return fit


def crossfit_rule(min_support: int) -> Fit:
    def fit(table: ThresholdTable) -> Thresholds:
        return fit_table(table, min_support=min_support)

    return fit


RULES: dict[str, Fit] = {
    "micro-old": micro_rule(guard=False),
    "micro": micro_rule(guard=True),
    "own-1": own_rule(1),
    "own-10": own_rule(10),
    "own-20": own_rule(20),
    "own-40": own_rule(40),
    "blend-10": blend_rule(10),
    "blend-30": blend_rule(30),
    "crossfit-10": crossfit_rule(10),
    "crossfit": crossfit_rule(1),
}


# -------------------------------------------------------------------------------------------- the comparison


def held_out(test: ThresholdTable, thresholds: Thresholds) -> dict[str, float]:
    """The held-out counts at `thresholds`, read from the held-out set's table (each label at its grid value)."""
    counts = test.counts()
    at = {key: GRID.index(thresholds.for_label(KIND_OF[key[0]], key[1])) for key in test.labels}
    labels = [counts[key][at[key]] for key in test.labels]
    with_gold = [c for c in labels if c.support]
    total = sum(labels, test.fixed())
    return {
        "micro": total.f1,
        "macro": statistics.fmean(c.f1 for c in with_gold),
        "worst": min(c.f1 for c in with_gold),
        "zero": float(sum(1 for c in with_gold if c.f1 == 0.0)),
    }


def _part(table: ThresholdTable, rows: Sequence[int]) -> ThresholdTable:
    return ThresholdTable(table.labels, tuple(table.rows[i] for i in rows), tuple(table.fixed_rows[i] for i in rows))


def compare(snapshots: list[dict[str, Any]], repeats: int) -> dict[str, dict[int, list[dict[str, Any]]]]:
    results: dict[str, dict[int, list[dict[str, Any]]]] = {name: {n: [] for n in SIZES} for name in RULES}
    results["oracle"] = {n: [] for n in SIZES}
    for snapshot in snapshots:
        test = ThresholdTable.of(snapshot["test"]["gold"], snapshot["test"]["predicted"])
        pool = ThresholdTable.of(snapshot["valid"]["gold"], snapshot["valid"]["predicted"])
        oracle = held_out(test, own_rule(1)(test))
        for n in SIZES:
            for r in range(repeats):
                table = _part(pool, sorted(random.Random(f"{snapshot['name']}:{n}:{r}").sample(range(POOL), n)))
                for name, rule in RULES.items():
                    results[name][n].append({**held_out(test, rule(table)), "snapshot": snapshot["name"]})
                results["oracle"][n].append({**oracle, "snapshot": snapshot["name"]})
    return results


def _mean(entries: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(float(e[key]) for e in entries)


def report(results: dict[str, dict[int, list[dict[str, Any]]]]) -> str:
    lines = ["held-out score of thresholds fitted on n validation records (mean over snapshots x draws)", ""]
    head = "| rule | " + " | ".join(f"n={n} micro / macro / worst / zero" for n in SIZES) + " |"
    lines += [head, "|---|" + "---:|" * len(SIZES)]
    for name, by_size in results.items():
        cells = [
            f"{_mean(e, 'micro'):.4f} / {_mean(e, 'macro'):.4f} / {_mean(e, 'worst'):.4f} / "
            f"{int(sum(x['zero'] for x in e))}"
            for e in by_size.values()
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    shown = ("micro-old", "own-1", "own-10", "crossfit-10", "crossfit", "oracle")
    lines += ["", f"per snapshot, n=40 (the demo's validation size): held-out macro F1 of {' / '.join(shown)}", ""]
    for snapshot in dict.fromkeys(e["snapshot"] for e in results["crossfit"][40]):
        cells = [f"{_mean([e for e in results[r][40] if e['snapshot'] == snapshot], 'macro'):.4f}" for r in shown]
        lines.append(f"  {snapshot:<16} " + " / ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/thr-bench", help="where the extractions are cached")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=8, help="validation draws per size and snapshot")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="model sources (default: both encoders)")
    parser.add_argument("--checkpoints", nargs="*", default=[], help="checkpoints of finished demo runs to add")
    parser.add_argument("--json", help="also write the per-draw results here")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    snapshots = extractions(out, args.seeds, args.epochs, args.models) + checkpoint_extractions(out, args.checkpoints)
    results = compare(snapshots, args.repeats)
    print(report(results))
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
