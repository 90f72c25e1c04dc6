"""Tiny, offline, deterministic GLiNER2 models and data for tests, benchmarks and demos.

Everything here is built in code: a WordLevel tokenizer over a fixed vocabulary
(:data:`TINY_WORDS`), a small BERT encoder, and the real gliner2 span or
boundary heads on top. Nothing touches the network, so the builders work with
``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``.

    save_tiny_model(dir, "span", seed=0)      -> native gliner2 model directory
    build_tiny_model("boundary", seed=0)      -> the object AutoExtractor.from_pretrained returns
    tiny_records(16, seed=0)                  -> native training records
    build_tiny_tokenizer(dir)                 -> fast tokenizer directory
    build_tiny_encoder_dir(dir, seed=0)       -> BERT encoder directory (config, weights, tokenizer)

Determinism: the same arguments give byte-identical files (``model.safetensors``,
``config.json``, tokenizer files), across processes and hash seeds. Building seeds torch locally and restores every global RNG it could touch
(torch CPU/CUDA, ``random``, numpy), so callers' RNG streams are unchanged.

Heavy modules (torch, transformers, tokenizers, gliner2) are imported inside
the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "BENCH_MODEL_SIZE",
    "GLINER2_SPECIAL_TOKENS",
    "TINY_ENTITY_TYPES",
    "TINY_SPECIAL_TOKENS",
    "TINY_WORDS",
    "build_tiny_encoder_dir",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "save_tiny_model",
    "tiny_boundary_head",
    "tiny_encoder_config",
    "tiny_records",
    "tiny_vocab",
]

ARCHITECTURES = ("span", "boundary")

#: Sizes for benchmarks: ``build_tiny_model(arch, **BENCH_MODEL_SIZE)``. Measured on
#: 2 CPU cores, forward+backward of a batch of 8 tiny records: span ~100 ms (6.0M
#: parameters), boundary ~65 ms (4.7M). The defaults (hidden 32, 1 layer) take
#: ~12 ms (span) / ~15 ms (boundary).
BENCH_MODEL_SIZE: Mapping[str, int] = MappingProxyType({"hidden_size": 256, "num_layers": 3})

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


# ---------------------------------------------------------------------------
# RNG isolation
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _isolated_rng(seed: int) -> Iterator[None]:
    """Seed torch/random/numpy for the block, then restore every global stream.

    torch.random.fork_rng restores the CPU generator (and CUDA generators when
    CUDA is initialised); ``random`` and numpy are saved and restored by hand
    because nothing in the build should leak into callers' streams either way.
    """
    import numpy as np
    import torch

    py_state = random.getstate()
    np_state = np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % (2**32))
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return seed


def _check_architecture(architecture: str) -> str:
    name = str(architecture).strip().lower()
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    return name


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def _make_fast_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_vocab()
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    # Splits on whitespace and on every punctuation character, as BERT does.
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    # Registered as added special tokens so "[P]", "[SEP_TEXT]"... are matched
    # whole before pre-tokenization (never split into "[", "p", "]").
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS + GLINER2_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        padding_side="right",
    )


def build_tiny_tokenizer(directory: str | os.PathLike[str]) -> Path:
    """Write a fast WordLevel tokenizer over :func:`tiny_vocab` into ``directory``.

    Lowercasing normalizer, BERT pre-tokenizer (whitespace + punctuation),
    ``[CLS] $A [SEP]`` post-processor, specials ``[PAD]``(0) ``[UNK]`` ``[CLS]``
    ``[SEP]`` ``[MASK]`` plus gliner2's ``[SEP_STRUCT]``, ``[SEP_TEXT]``, ``[P]``,
    ``[C]``, ``[E]``, ``[R]``, ``[L]``, ``[EXAMPLE]``, ``[OUTPUT]``,
    ``[DESCRIPTION]``. Loadable offline with ``AutoTokenizer.from_pretrained``.
    Returns the directory.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    _make_fast_tokenizer().save_pretrained(str(path))
    return path


# ---------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------


def _default_heads(hidden_size: int) -> int:
    heads = hidden_size // 16 if hidden_size <= 64 else hidden_size // 64
    heads = max(1, heads)
    while hidden_size % heads:
        heads -= 1
    return heads


def tiny_encoder_config(
    hidden_size: int = 32,
    num_layers: int = 1,
    *,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
    max_position_embeddings: int = 512,
):
    """A ``transformers.BertConfig`` sized to :func:`tiny_vocab` (no resize needed)."""
    from transformers import BertConfig

    if hidden_size <= 0 or num_layers <= 0:
        raise ValueError("hidden_size and num_layers must be > 0")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    heads = num_heads or _default_heads(hidden_size)
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {heads}")
    return BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        hidden_act="gelu",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=max_position_embeddings,
        type_vocab_size=2,
        initializer_range=0.02,
        pad_token_id=0,
    )


def build_tiny_encoder_dir(
    directory: str | os.PathLike[str],
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 1,
    *,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
) -> Path:
    """Save a randomly initialised tiny ``BertModel`` plus the tiny tokenizer.

    ``directory`` then works as an encoder ``model_name`` for
    ``AutoModel``/``AutoTokenizer.from_pretrained`` (offline). Same seed and
    sizes -> byte-identical ``model.safetensors``. Returns the directory.
    """
    from transformers import BertModel

    _check_seed(seed)
    config = tiny_encoder_config(
        hidden_size,
        num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        dropout=dropout,
    )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with _isolated_rng(seed):
        model = BertModel(config)
    model.save_pretrained(str(path))
    build_tiny_tokenizer(path)
    return path


# ---------------------------------------------------------------------------
# Extractor models
# ---------------------------------------------------------------------------


def tiny_boundary_head(hidden_size: int = 32, dropout: float = 0.0) -> dict[str, Any]:
    """Boundary-head settings scaled down to a tiny encoder.

    gliner2's defaults are 128 wide (``boundary_dim``, ``pair_dim``,
    ``record_dim``; ``content_dim`` 64); here they follow the hidden size,
    clamped to [32, 128] and rounded down to a multiple of 8 (``pair_dim``
    must divide by the 8 compat heads and the 4 candidate-attention heads).
    Only widths change; the structure (records, relations, candidate
    attention, count head, abstention) stays at gliner2's defaults so the
    tiny model exercises the same code paths as a real one.
    """
    width = min(128, max(32, (hidden_size // 8) * 8))
    return {
        "boundary_dim": width,
        "pair_dim": width,
        "record_dim": width,
        "content_dim": width,
        "dropout": dropout,
    }


def _extractor_config(
    architecture: str,
    *,
    hidden_size: int,
    dropout: float,
    max_width: int,
    boundary_head: Mapping[str, Any] | None,
):
    from gliner2.configuration import ExtractorConfig

    common: dict[str, Any] = {
        "model_name": "prefect-gliner2/tiny-bert",  # never resolved: tokenizer and encoder config are passed in
        "architecture": architecture,
        "token_pooling": "first",
        "attn_implementation": "sdpa",
    }
    if architecture == "span":
        return ExtractorConfig(
            **common,
            span_head={"max_width": max_width, "dropout": dropout},
            counting_layer="count_lstm",
        )
    head = tiny_boundary_head(hidden_size, dropout)
    head.update(dict(boundary_head or {}))
    return ExtractorConfig(**common, boundary_head=head)


def save_tiny_model(
    directory: str | os.PathLike[str],
    architecture: str = "span",
    seed: int = 0,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    dropout: float = 0.0,
    max_width: int = 8,
    boundary_head: Mapping[str, Any] | None = None,
) -> Path:
    """Write a native gliner2 model directory that ``AutoExtractor.from_pretrained`` loads offline.

    Layout (gliner2's own ``save_pretrained``): ``config.json`` (with
    ``"architecture"``), ``encoder_config/config.json``, ``model.safetensors``,
    ``tokenizer.json`` + ``tokenizer_config.json``.

    ``dropout`` sets the encoder's hidden/attention dropout and the boundary
    head's dropout. (The span head has a hard-coded 0.1 dropout in
    ``span_rep`` whatever the config says.) ``boundary_head`` overrides
    individual boundary settings on top of :func:`tiny_boundary_head`.

    Deterministic: same arguments -> byte-identical ``model.safetensors`` and
    ``config.json``. Global RNG state is left untouched. Returns the directory.
    """
    import gliner2

    arch = _check_architecture(architecture)
    _check_seed(seed)
    encoder_config = tiny_encoder_config(
        hidden_size,
        num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        dropout=dropout,
    )
    config = _extractor_config(
        arch,
        hidden_size=hidden_size,
        dropout=dropout,
        max_width=max_width,
        boundary_head=boundary_head,
    )
    model_class = gliner2.BoundaryExtractor if arch == "boundary" else gliner2.SpanExtractor
    tokenizer = _make_fast_tokenizer()
    with _isolated_rng(seed):
        model = model_class(config, encoder_config=encoder_config, tokenizer=tokenizer)
    vocab_size = len(tiny_vocab())
    if len(model.processor.tokenizer) != vocab_size:  # pragma: no cover - guards a gliner2 change
        raise RuntimeError(
            f"gliner2 grew the tiny tokenizer from {vocab_size} to {len(model.processor.tokenizer)} "
            "tokens; add the new special tokens to GLINER2_SPECIAL_TOKENS"
        )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    return path


def build_tiny_model(
    architecture: str = "span",
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 1,
    directory: str | os.PathLike[str] | None = None,
    **kwargs: Any,
):
    """Build a tiny model and load it exactly as ``gliner2.AutoExtractor.from_pretrained`` would.

    Saves with :func:`save_tiny_model` into ``directory`` (kept) or a
    temporary directory (deleted after loading), then returns
    ``AutoExtractor.from_pretrained(dir)``: a ``gliner2.SpanExtractor`` or
    ``gliner2.BoundaryExtractor``, fp32, on CPU and -- as gliner2 returns it --
    in *training* mode (``model.training`` is True; gliner2's extract methods
    call ``eval()`` themselves and do not switch back). ``kwargs`` go to
    :func:`save_tiny_model` (``dropout``, ``max_width``, ``boundary_head``,
    ``num_heads``, ``intermediate_size``).

    Note: a model loaded from a temporary directory has ``name_or_path``
    pointing at a directory that no longer exists; pass ``directory`` when
    that matters (e.g. PEFT adapters record it).
    """
    from gliner2.auto import AutoExtractor

    def load(path: Path):
        with _isolated_rng(seed):  # loading builds then overwrites weights; keep callers' RNG intact
            return AutoExtractor.from_pretrained(str(path))

    if directory is not None:
        path = save_tiny_model(
            directory, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs
        )
        return load(path)
    with tempfile.TemporaryDirectory(prefix="tiny-gliner2-") as tmp:
        path = save_tiny_model(
            tmp, architecture, seed, hidden_size=hidden_size, num_layers=num_layers, **kwargs
        )
        return load(path)


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
    _check_seed(seed)
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
