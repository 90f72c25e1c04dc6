"""The obvious baseline for a fixed label set: the same encoder fine-tuned as a BIO token classifier (transformers).

    python bench/token_classifier.py ENCODER_DIR TRAIN.jsonl TEST.jsonl OUT.json [--epochs 5] [--lr 5e-5] [--seed 7]

bench/realdata.py runs it in a fresh interpreter beside the GLiNER2 trainers. Records are the native ones the
GLiNER2 runs train on (``{"input": text, "output": {"entities": {label: [mentions]}}}``, the text being the corpus'
words joined by single spaces): every occurrence of a mention's words in a record's words is tagged ``B-label`` /
``I-label`` (earlier labels first, never overwriting a tag), so the classifier learns from the same records.
``AutoModelForTokenClassification`` on the encoder directory, labels on each word's first sub-token, AdamW with a
linear schedule (10% warmup), batch 8, fp32 on CPU. Its predictions are decoded back to mention texts per label and
written as gliner2-style payloads (``{"entities": {label: [texts]}}``), so bench/realdata.py scores them with the
same rules as the GLiNER2 models (``session_core.scoring.score_records``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

__all__ = ["bio_tags", "decode", "train_and_predict"]


def read_jsonl(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def bio_tags(record: dict[str, Any], labels: list[str]) -> tuple[list[str], list[str]]:
    """The record's words and their BIO tags (see the module docstring)."""
    words = record["input"].split(" ")
    tags = ["O"] * len(words)
    for label in labels:
        for mention in record["output"]["entities"].get(label) or []:
            target = str(mention).split(" ")
            for start in range(len(words) - len(target) + 1):
                span = range(start, start + len(target))
                if words[start : start + len(target)] == target and all(tags[i] == "O" for i in span):
                    tags[start] = f"B-{label}"
                    for i in span[1:]:
                        tags[i] = f"I-{label}"
    return words, tags


def decode(words: list[str], tags: list[str]) -> dict[str, list[str]]:
    """Mention texts per label from BIO tags (an I- tag without its B- opens a mention, as conlleval does)."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    kind = None
    for word, tag in [*zip(words, tags, strict=True), ("", "O")]:
        continues = tag.startswith("I-") and tag[2:] == kind
        if current and not continues:
            text = " ".join(current)
            if text not in found.setdefault(str(kind), []):
                found[str(kind)].append(text)
            current, kind = [], None
        if tag.startswith("B-") or (tag.startswith("I-") and not continues):
            current, kind = [word], tag[2:]
        elif continues:
            current.append(word)
    return found


def _encode(tokenizer: Any, words: list[str], tags: list[str] | None, index: dict[str, int]) -> dict[str, Any]:
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=256)
    word_ids = encoded.word_ids()
    labels, previous = [], None
    for word in word_ids:
        first = word is not None and word != previous
        labels.append(index[tags[word]] if first and tags is not None else -100)
        previous = word
    return {"input_ids": encoded["input_ids"], "labels": labels, "word_ids": word_ids}


def _batches(items: list[dict[str, Any]], size: int, pad_id: int) -> Any:
    import torch

    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        width = max(len(item["input_ids"]) for item in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, item in enumerate(chunk):
            n = len(item["input_ids"])
            ids[row, :n] = torch.tensor(item["input_ids"])
            labels[row, :n] = torch.tensor(item["labels"])
            mask[row, :n] = 1
        yield chunk, ids, mask, labels


def train_and_predict(
    encoder: str,
    train: list[dict[str, Any]],
    test: list[dict[str, Any]],
    *,
    epochs: int = 5,
    lr: float = 5e-5,
    batch_size: int = 8,
    seed: int = 7,
) -> dict[str, Any]:
    """Fine-tune a token classifier on `train`, predict `test`; returns the payloads and the training seconds."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, get_linear_schedule_with_warmup

    labels = list(dict.fromkeys(label for r in train + test for label in r["output"]["entities"]))
    tag_names = ["O"] + [f"{p}-{label}" for label in labels for p in ("B", "I")]
    index = {name: i for i, name in enumerate(tag_names)}
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    model = AutoModelForTokenClassification.from_pretrained(
        encoder, num_labels=len(tag_names), id2label=dict(enumerate(tag_names)), label2id=index
    )
    items = [_encode(tokenizer, *bio_tags(r, labels), index) for r in train]
    steps = epochs * -(-len(items) // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    started = time.perf_counter()
    model.train()
    for _ in range(epochs):
        order = list(range(len(items)))
        random.shuffle(order)
        for _, ids, mask, gold in _batches([items[i] for i in order], batch_size, tokenizer.pad_token_id):
            loss = model(input_ids=ids, attention_mask=mask, labels=gold).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    seconds = time.perf_counter() - started
    return {"predictions": _predict(model, tokenizer, test, index, tag_names), "train_seconds": seconds}


def _predict(model: Any, tokenizer: Any, test: list[dict[str, Any]], index: dict[str, int], names: list[str]) -> Any:
    import torch

    model.eval()
    items = [_encode(tokenizer, r["input"].split(" "), None, index) for r in test]
    predictions: list[dict[str, Any]] = []
    with torch.no_grad():
        for chunk, ids, mask, _ in _batches(items, 16, tokenizer.pad_token_id):
            best = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
            for row, item in enumerate(chunk):
                words = test[len(predictions)]["input"].split(" ")
                tags = ["O"] * len(words)
                previous = None
                for position, word in enumerate(item["word_ids"]):
                    if word is not None and word != previous:
                        tags[word] = names[int(best[row, position])]
                    previous = word
                predictions.append({"entities": decode(words, tags)})
    return predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("encoder")
    parser.add_argument("train")
    parser.add_argument("test")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    result = train_and_predict(
        args.encoder, read_jsonl(args.train), read_jsonl(args.test), epochs=args.epochs, lr=args.lr, seed=args.seed
    )
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
