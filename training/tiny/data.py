"""Tiny offline data for tests, benchmarks and demos: the fixed vocabulary and seeded native training records.

Torch-free. The tokenizer and models of `prefect_gliner2.training.tiny` are built over this vocabulary;
`tiny_records(n, seed)` draws records whose every mention occurs in the text, from private `random.Random` instances
(never the global stream), so record i depends only on (seed, i).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = [
    "GLINER2_SPECIAL_TOKENS",
    "TINY_ENTITY_TYPES",
    "TINY_SPECIAL_TOKENS",
    "TINY_WORDS",
    "tiny_records",
    "tiny_vocab",
]

# BERT-style specials first, so [PAD] is id 0 (BertConfig.pad_token_id default).
TINY_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# gliner2.processor.SchemaTransformer.SPECIAL_TOKENS. The processor registers
# them with ``add_special_tokens``; having them in the vocabulary already means
# the tokenizer does not grow and the encoder embeddings are never resized.
GLINER2_SPECIAL_TOKENS: tuple[str, ...] = (
    "[SEP_STRUCT]",
    "[SEP_TEXT]",
    "[P]",
    "[C]",
    "[E]",
    "[R]",
    "[L]",
    "[EXAMPLE]",
    "[OUTPUT]",
    "[DESCRIPTION]",
)

TINY_ENTITY_TYPES: tuple[str, ...] = ("person", "city", "company", "day")

_FIRST_NAMES: tuple[str, ...] = tuple(
    (
        "alice bob carol david emma frank grace henry irene jack karen liam maria noah olivia peter quinn "
        "rosa sam tina umar vera walter xena yuki zoe john mary omar lena"
    ).split()
)
_LAST_NAMES: tuple[str, ...] = tuple(
    (
        "smith jones brown garcia miller davis lopez wilson moore taylor clark lewis walker hall young "
        "king wright scott green baker"
    ).split()
)
_CITIES: tuple[str, ...] = tuple(
    (
        "paris, london, berlin, madrid, rome, vienna, prague, lisbon, dublin, oslo, athens, warsaw, "
        "tokyo, seoul, delhi, cairo, lagos, nairobi, lima, quito, toronto, chicago, boston, denver, "
        "austin, seattle, sydney, zurich, new york, san diego, hong kong, buenos aires"
    ).split(", ")
)
_COMPANY_NAMES: tuple[str, ...] = tuple(
    (
        "acme globex initech umbrella hooli vandelay wayne stark tyrell cyberdyne soylent wonka oscorp "
        "nakatomi aperture monarch"
    ).split()
)
_COMPANY_SUFFIXES = ("corp", "labs", "systems", "industries", "group", "bank", "motors", "foods")
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_FILLER: tuple[str, ...] = tuple(
    (
        "a an the and or but so with from to in at on of for by into near after before during then also "
        "again very really not is was were are be been has had have will would said says that this who it "
        "its he she they we his her their our lives lived works worked moved visited met joined left "
        "founded opened bought sold called hired flew drove traveled announced plans expand signed office "
        "team meeting conference project deal contract week year last next early late morning evening "
        "yesterday today tomorrow headquarters branch store factory market report news manager engineer "
        "founder director ceo friend colleague old big small great good bad happy angry excited worried "
        "pleased upset calm because when where there here people new first second third back home trip "
        "flight train car work job role launch product partner partnership weather rain sun nice terrible "
        "fine about up down over hire as name employee employer location organization"
    ).split()
)

# Words the gliner2 processor itself puts into prompts: task names, synthetic
# labels ("entity 1", "label 2", "field 3"), classification tasks and labels.
_SCHEMA_WORDS: tuple[str, ...] = tuple(
    (
        "entities entity label labels field fields classifications relations relation json structures "
        "selection choices person city company day sentiment positive negative neutral topic travel "
        "business dummy head tail description example output"
    ).split()
)

_PUNCTUATION = (".", ",", "(", ")", "|", ":", ";", "-", "_", "'", '"', "!", "?", "/", "&", "[", "]")
_NUMBERS = tuple(str(i) for i in range(0, 65))


def _build_words() -> tuple[str, ...]:
    words: list[str] = []
    seen = set(TINY_SPECIAL_TOKENS) | set(GLINER2_SPECIAL_TOKENS)
    groups = (
        _PUNCTUATION,
        _NUMBERS,
        _SCHEMA_WORDS,
        _FILLER,
        _FIRST_NAMES,
        _LAST_NAMES,
        tuple(w for city in _CITIES for w in city.split()),
        _COMPANY_NAMES,
        _COMPANY_SUFFIXES,
        _DAYS,
    )
    for group in groups:
        for word in group:
            if word not in seen:
                seen.add(word)
                words.append(word)
    return tuple(words)


#: The fixed lowercase word vocabulary (not counting special tokens). Every word
#: :func:`tiny_records` produces, and every word gliner2 adds to its prompts for
#: those records, is in here, so the tiny tokenizer never emits ``[UNK]`` for them.
TINY_WORDS: tuple[str, ...] = _build_words()


def tiny_vocab() -> dict[str, int]:
    """Token -> id: BERT specials (``[PAD]`` = 0), gliner2 specials, then :data:`TINY_WORDS`."""
    tokens = TINY_SPECIAL_TOKENS + GLINER2_SPECIAL_TOKENS + TINY_WORDS
    return {token: index for index, token in enumerate(tokens)}


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return seed


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------

_SENTIMENT_CUES = {
    "positive": ("happy", "excited", "pleased"),
    "negative": ("angry", "worried", "upset"),
    "neutral": ("calm", "fine"),
}


def _title(phrase: str) -> str:
    return " ".join(word.capitalize() for word in phrase.split())


def _person(rng: random.Random) -> str:
    first = _title(rng.choice(_FIRST_NAMES))
    if rng.random() < 0.5:
        return f"{first} {_title(rng.choice(_LAST_NAMES))}"
    return first


def _company(rng: random.Random) -> str:
    name = _title(rng.choice(_COMPANY_NAMES))
    if rng.random() < 0.6:
        return f"{name} {_title(rng.choice(_COMPANY_SUFFIXES))}"
    return name


_TEMPLATES = (
    "{p} lives in {c}.",
    "{p} works at {o} in {c}.",
    "{p} moved to {c} last year.",
    "{p} met {p2} at the {o} office in {c} on {d}.",
    "{o} opened a new branch in {c}.",
    "On {d} {p} flew from {c} to {c2}.",
    "{p} joined {o} as a manager.",
    "The {o} headquarters is in {c}.",
    "{p} and {p2} signed the contract with {o} on {d}.",
    "{o} announced plans to expand into {c} next year.",
    "{p}, the founder of {o}, visited {c} again.",
    "Yesterday {p} called {p2} about the deal.",
    "It was a very nice morning in {c}.",
    "The weather was terrible on {d}.",
    "{p} said that {o} will hire people in {c}.",
)


def _sentence(rng: random.Random, entities: dict[str, list[str]]) -> str:
    template = rng.choice(_TEMPLATES)
    people = [_person(rng), _person(rng)]
    while people[1] == people[0]:
        people[1] = _person(rng)
    cities = rng.sample(_CITIES, 2)
    values = {
        "p": people[0],
        "p2": people[1],
        "c": _title(cities[0]),
        "c2": _title(cities[1]),
        "o": _company(rng),
        "d": _title(rng.choice(_DAYS)),
    }
    kinds = {"p": "person", "p2": "person", "c": "city", "c2": "city", "o": "company", "d": "day"}
    for key, kind in kinds.items():
        if "{" + key + "}" in template:
            mentions = entities[kind]
            if values[key] not in mentions:
                mentions.append(values[key])
    return template.format(**values)


def tiny_records(n: int, seed: int = 0, *, classifications: bool = False) -> list[dict[str, Any]]:
    """``n`` native gliner2 training records built from :data:`TINY_WORDS`.

    Each record is ``{"input": text, "output": {"entities": {type: [mentions]}}}``
    with 1-4 sentences (roughly 4-50 words), entity types from
    :data:`TINY_ENTITY_TYPES` (types absent from the text are omitted), every
    mention occurring verbatim in the text. Record ``i`` depends only on
    ``(seed, i)``, so ``tiny_records(8) == tiny_records(16)[:8]``. Uses private
    ``random.Random`` instances; global RNG is untouched.

    ``classifications=True`` adds a sentiment sentence and a
    ``{"task": "sentiment", "labels": [...], "true_label": [...]}``
    classification to every third record (both architectures train on it).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    check_seed(seed)
    records: list[dict[str, Any]] = []
    for index in range(n):
        rng = random.Random(f"prefect-gliner2-tiny:{seed}:{index}")
        entities: dict[str, list[str]] = {kind: [] for kind in TINY_ENTITY_TYPES}
        sentences = [_sentence(rng, entities) for _ in range(rng.randint(1, 4))]
        output: dict[str, Any] = {}
        if classifications and index % 3 == 0:
            label = rng.choice(sorted(_SENTIMENT_CUES))
            cue = rng.choice(_SENTIMENT_CUES[label])
            sentences.append(f"{rng.choice(('He', 'She', 'They'))} was very {cue}.")
            output["classifications"] = [
                {
                    "task": "sentiment",
                    "labels": ["positive", "negative", "neutral"],
                    "true_label": [label],
                }
            ]
        if not any(entities.values()):
            # weather-only text: give it a named subject so every record has an entity
            subject = _person(rng)
            sentences.insert(0, f"{subject} said:")
            entities["person"].append(subject)
        output["entities"] = {kind: mentions for kind, mentions in entities.items() if mentions}
        records.append({"input": " ".join(sentences), "output": output})
    return records
