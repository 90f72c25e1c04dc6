"""Does a trained GLiNER2 model tell its labels apart? Three measurements on one exported model and held-out records.

    python bench/label_probe.py --model /tmp/rd2/flow-0 --data /tmp/rd2/test.jsonl [--init /tmp/rd2/minilm-span-seed0]

1. Own label on top: for each gold mention the model finds under some label (extraction at a low threshold with
   confidences, each record's labels asked in a seeded random order), whether its own label scores highest among the
   labels that found it; printed with the confusion matrix (gold label -> top-scoring label). Chance is 1/k for k
   labels; a model that reads the label's name is near 1.
2. Same answer for every label: on a fixed sentence, the spans and confidences under each label, in two orders and
   each label asked alone. A label-agnostic model gives every label the same list.
3. Label or position: gliner2 reads a label at the ``[E]`` marker before its name, and scores spans against the
   query its count head makes of that marker. Over every order of the labels (at most 24, seeded) on the fixed
   sentence, the variation of the markers and of the queries around their mean is split into the part explained by
   the label and the part explained by the position in the prompt; printed with the mean's norm. A model that tells
   labels apart has queries whose label part is large against the mean (the part all labels share).
4. The name at the marker: a logistic-regression probe
   (standardised features, trained on half the records' prompts, scored on the other half, each prompt's labels in a
   random order) predicts which label a marker belongs to from the encoder's output at that marker: near 1 when
   the name reaches the marker, 1/k when it does not. ``--init`` probes the model the run started from as well.
5. ``--marker-words type,entity,is,the,[MASK]`` (instead of 1-4; usually on an init model): the ``[E]`` marker's
   input embedding set to each word's, to the vocabulary's mean embedding (the centre of the draw transformers gives
   a new token) and as loaded; for each, measurement 3's label part and position part of the markers' output, their
   ratio, and the share of the markers' variance each explains. How init-model's marker word was chosen
   (runtime/model_init.py).

Reads the model with gliner2 itself (``GLiNER2.from_pretrained``); the probe uses the loaded model's encoder and
tokenizer (``model.encoder``, ``model.processor.tokenizer``), not the product's packages. CPU, a minute or two.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

SENTENCE = "George Smith flew from Paris to meet Exxon officials in Germany ."


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _labels(records: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for record in records:
        for label in record["output"].get("entities", {}):
            seen.setdefault(label, None)
    return list(seen)


def own_label_on_top(model: Any, records: list[dict[str, Any]], labels: list[str], threshold: float) -> None:
    rng = random.Random(0)
    confusion: dict[str, Counter[str]] = {label: Counter() for label in labels}
    for record in records:
        order = labels[:]
        rng.shuffle(order)
        found = model.extract_entities(record["input"], order, threshold=threshold, include_confidence=True)
        entities = found["entities"]
        for gold, mentions in record["output"].get("entities", {}).items():
            for mention in mentions:
                scores = {
                    label: max((e["confidence"] for e in entities.get(label, []) if e["text"] == mention), default=0.0)
                    for label in labels
                }
                if max(scores.values()) > 0.0:
                    confusion[gold][max(scores, key=lambda label: scores[label])] += 1
    total = sum(sum(row.values()) for row in confusion.values())
    top = sum(confusion[label][label] for label in labels)
    print(
        f"1. gold mentions found at {threshold}: {total}; own label scores highest: {top} "
        f"({top / max(total, 1):.2f}; chance {1 / len(labels):.2f})"
    )
    print("   gold \\ top-scoring: " + " | ".join(labels))
    for label in labels:
        print(f"   {label}: " + " | ".join(str(confusion[label][other]) for other in labels))


def same_answer(model: Any, labels: list[str], threshold: float) -> None:
    print(f"2. {SENTENCE!r}, threshold {threshold}:")
    for order in (labels, labels[::-1], *[[label] for label in labels]):
        found = model.extract_entities(SENTENCE, order, threshold=threshold, include_confidence=True)["entities"]
        shown = {k: [(e["text"], round(e["confidence"], 2)) for e in v] for k, v in found.items()}
        print(f"   asked {order}: {shown}")


def _markers(model: Any, words_after: list[str], order: list[str]) -> Any:
    """The encoder's outputs at the ``[E]`` markers of an entity prompt asking `order`, before `words_after`."""
    import torch

    tokenizer = model.processor.tokenizer
    words = ["(", "[P]", "entities", "("] + [w for label in order for w in ("[E]", label)] + [")", ")"]
    ids = [tokenizer.cls_token_id]
    for word in [*words, "[SEP_TEXT]", *words_after]:
        ids += tokenizer.convert_tokens_to_ids(tokenizer.tokenize(word))
    ids = [*ids[:511], tokenizer.sep_token_id]
    with torch.no_grad():
        hidden = model.encoder(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    marker = tokenizer.convert_tokens_to_ids("[E]")
    return hidden.last_hidden_state[0, [i for i, token in enumerate(ids) if token == marker]]


def _split(model: Any, labels: list[str]) -> dict[str, tuple[float, float, float, float, float]]:
    """Over every order of `labels` (at most 24, seeded) on the fixed sentence, for the markers and the queries:
    the label part and the position part of their variation around the mean (the mean norm of the label means' and
    the position means' offsets from it), the mean's norm, and the share of the variance (mean squared distance to the
    mean) each part explains."""
    import itertools

    import torch

    orders = list(itertools.permutations(labels))
    orders = random.Random(0).sample(orders, min(24, len(orders)))
    rows: list[tuple[int, int, Any, Any]] = []
    model.eval()
    for order in orders:
        markers = _markers(model, SENTENCE.split(), list(order))
        with torch.no_grad():
            queries = model.count_embed(markers, 1)[0]
        rows += [(labels.index(label), p, markers[p], queries[p]) for p, label in enumerate(order)]
    split = {}
    for name, column in (("markers", 2), ("queries", 3)):
        x = torch.stack([row[column] for row in rows])
        mean = x.mean(0)
        total = float(((x - mean) ** 2).sum(1).mean())
        norms, shares = [], []
        for key in (0, 1):
            groups = [x[[i for i, row in enumerate(rows) if row[key] == k]] for k in range(len(labels))]
            offsets = torch.stack([g.mean(0) - mean for g in groups if len(g)])
            norms.append(float(offsets.norm(dim=1).mean()))
            shares.append(float((offsets**2).sum(1).mean()) / total)
        split[name] = (norms[0], norms[1], float(mean.norm()), shares[0], shares[1])
    return split


def label_or_position(model: Any, labels: list[str]) -> None:
    for name, (label, position, mean, _, _) in _split(model, labels).items():
        print(
            f"3. {name}: label part {label:.2f}, position part {position:.2f}, mean {mean:.2f} "
            f"(label part / mean {label / mean:.3f})"
        )


def marker_words(model: Any, labels: list[str], words: list[str]) -> None:
    """The ``[E]`` marker's input embedding set to each word's (and to the vocabulary's mean embedding, the centre
    of the draw transformers gives a new token): how much of the marker's output the label after it explains against
    its position in the prompt (the same split as measurement 3, on the markers)."""
    import torch

    tokenizer = model.processor.tokenizer
    table = model.encoder.get_input_embeddings().weight
    marker = tokenizer.convert_tokens_to_ids("[E]")
    loaded = table[marker].detach().clone()
    candidates = {"as loaded": loaded, "mean embedding": table[: len(tokenizer) - 1].detach().mean(0)}
    for word in words:
        ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(word))
        if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
            raise SystemExit(f"--marker-words: {word!r} is not one token of this model's tokenizer ({ids})")
        candidates[word] = table[ids[0]].detach().clone()
    print(
        f"the [E] marker's input embedding set to each candidate ({len(labels)} labels, their orders on one sentence):"
    )
    print(
        f"{'start':<16} {'label part':>10} {'position part':>13} {'label / position':>16} {'variance: label':>15} "
        f"{'position':>8}"
    )
    try:
        for name, vector in candidates.items():
            with torch.no_grad():
                table[marker] = vector
            label, position, _, label_share, position_share = _split(model, labels)["markers"]
            print(
                f"{name:<16} {label:>10.2f} {position:>13.2f} {label / position:>16.2f} {label_share:>15.1%} "
                f"{position_share:>8.1%}"
            )
    finally:
        with torch.no_grad():
            table[marker] = loaded


def marker_probe(model: Any, records: list[dict[str, Any]], labels: list[str]) -> float:
    import torch

    rng = random.Random(0)
    features, targets = [], []
    model.eval()
    for record in records:
        order = labels[:]
        rng.shuffle(order)
        features += list(_markers(model, record["input"].split(), order))
        targets += [labels.index(label) for label in order]
    x, y = torch.stack(features), torch.tensor(targets)
    half = (len(records) // 2) * len(labels)
    x = (x - x[:half].mean(0)) / (x[:half].std(0) + 1e-6)
    torch.manual_seed(0)
    weight = torch.zeros(x.shape[1], len(labels), requires_grad=True)
    bias = torch.zeros(len(labels), requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=1e-2)
    for _ in range(300):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x[:half] @ weight + bias, y[:half]) + 1e-3 * (weight**2).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float(((x[half:] @ weight + bias).argmax(1) == y[half:]).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an exported model directory")
    parser.add_argument("--data", required=True, type=Path, help="held-out records (gliner2 JSONL)")
    parser.add_argument("--init", help="the model the run started from (init-model's output), probed as well")
    parser.add_argument("--threshold", type=float, default=0.02)
    parser.add_argument("--probe-records", type=int, default=120)
    parser.add_argument(
        "--marker-words",
        help="comma-separated words: compare starting the [E] marker as each of them (measurement 5) and stop",
    )
    args = parser.parse_args()

    from gliner2 import GLiNER2

    records = _records(args.data)
    labels = _labels(records)
    model = GLiNER2.from_pretrained(args.model)
    if args.marker_words:
        marker_words(model, labels, [w.strip() for w in args.marker_words.split(",") if w.strip()])
        return
    own_label_on_top(model, records, labels, args.threshold)
    same_answer(model, labels, 0.05)
    label_or_position(model, labels)
    probed = records[: args.probe_records]
    print(
        f"4. label probe at the [E] markers ({len(probed)} records, chance {1 / len(labels):.2f}): "
        f"trained {marker_probe(model, probed, labels):.3f}",
        end="",
    )
    if args.init:
        print(f", start {marker_probe(GLiNER2.from_pretrained(args.init), probed, labels):.3f}", end="")
    print()


if __name__ == "__main__":
    main()
