"""A new GLiNER2 model on a pretrained encoder, built the way gliner2 builds one (``prefect-gliner2 init-model``).

gliner2 makes a new model from an encoder with ``AutoExtractor.from_config(ExtractorConfig(model_name=ENCODER,
architecture=...))``: the encoder's weights and tokenizer are loaded with ``transformers``' ``AutoModel`` /
``AutoTokenizer`` (offline when ENCODER is a local directory), gliner2 adds its special tokens, and the task heads are
initialised at random. ``init_model`` does exactly that under a fixed seed and saves the result with gliner2's own
``save_pretrained``, so ``AutoExtractor.from_pretrained(out)`` and every command of this product load it.

Two things are added. A span model's count head is pinned to predict one instance for every label
(``engine.native.pin_count_head``). gliner2 2.1.0 trains no count loss for entity tasks, yet its inference
extracts an entity label only when the count head predicts a count above zero; a random head predicts whatever its
initialisation says (often 0 for every label), and the trained model then extracts nothing at any threshold.
Boundary models decode without that head.

And the entity-label marker ``[E]`` starts as the encoder's embedding of the word ``MARKER_WORD`` ("type"), not as
transformers' draw around the mean embedding (``engine.native.seed_entity_marker``). gliner2 reads each label at the
``[E]`` before its name, so a label's identity reaches the model only as far as the encoder carries the name into
that marker. From the mean-embedding draw, the marker's output on all-MiniLM-L6-v2 is 96% a function of its position
in the prompt and 1% of the name after it (the variation over the 24 orders of four labels; bench/label_probe.py);
under shuffled label orders the position is noise, and the model trained from it tags every mention with every label
(issue 43: CoNLL-2003, 200 sentences, 20 epochs: the same spans with the same confidences under every label, micro
F1 0.331). A marker that starts as "type" is read by the encoder as a word that introduces the next one ("type
person"): the name's part of its output equals the position's (label / position 1.05 against 0.11; "entity" 0.91,
"is" 0.86, "the" 0.78, [MASK] 0.15: ``bench/label_probe.py --marker-words``), and the same run reaches micro F1
0.558 with the labels told apart.
torch and gliner2 load inside the functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.layout import MODEL_CONFIG_FILE

__all__ = ["ARCHITECTURES", "InitResult", "init_model"]

ARCHITECTURES = ("span", "boundary")
#: The word whose embedding the entity-label marker starts from (see the module docstring).
MARKER_WORD = "type"
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class InitResult:
    """What ``init_model`` built: where, on which encoder, and its sizes."""

    out: str
    encoder: str
    architecture: str
    parameters: int
    tokenizer_size: int
    count_head: int | None  # the count a span model's head is pinned to; None for boundary models

    def describe(self) -> str:
        head = f", count head pinned to {self.count_head}" if self.count_head is not None else ""
        return (
            f"{self.architecture} model on {self.encoder}: {self.parameters / 1e6:.1f}M parameters, "
            f"tokenizer {self.tokenizer_size} tokens{head}, entity marker [E] from {MARKER_WORD!r}; "
            f"written to {self.out}"
        )


def init_model(
    encoder: str, architecture: str, out: str | os.PathLike[str], *, seed: int = 0, count: int = 1
) -> InitResult:
    """Build a GLiNER2 ``architecture`` model on ``encoder`` (a local encoder directory or a Hugging Face id) and save
    it to ``out`` (a new or empty directory; written through a staging directory, so it is never half-written).
    The task heads' initialisation is fixed by ``seed`` (global RNG streams are left as they were); a span model's
    count head is pinned to ``count``; the entity marker starts as ``MARKER_WORD`` (see the module docstring)."""
    from prefect_gliner2.training.engine.native import pin_count_head, seed_entity_marker, tokenizer_of

    arch = _check_architecture(architecture)
    source = check_encoder(encoder)
    target = _check_out(out)
    model = _build(source, arch, seed)
    seed_entity_marker(model, MARKER_WORD)
    if arch == "span":
        pin_count_head(model, count)
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".init-model-", dir=parent)
    try:
        model.save_pretrained(staging)
        if os.path.isdir(target):
            os.rmdir(target)  # empty (checked above)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return InitResult(
        out=target,
        encoder=source,
        architecture=arch,
        parameters=sum(p.numel() for p in model.parameters()),
        tokenizer_size=len(tokenizer_of(model)),
        count_head=count if arch == "span" else None,
    )


def check_encoder(encoder: str) -> str:
    """The encoder source as gliner2 should load it: an absolute local directory, or a Hugging Face id."""
    if not isinstance(encoder, str) or not encoder.strip():
        raise ConfigError("--encoder must be a local encoder directory or a Hugging Face id like 'owner/name'")
    path = os.path.expanduser(encoder)
    if os.path.isdir(path):
        config_path = os.path.join(path, MODEL_CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise ConfigError(
                f"encoder directory {encoder!r} has no config.json; pass a Hugging Face encoder directory "
                "(config.json, the weights and the tokenizer files)"
            )
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
        if isinstance(config, dict) and ("architecture" in config or config.get("model_type") == "extractor"):
            raise ConfigError(f"{encoder!r} is already a GLiNER2 model, not an encoder; train it directly with --model")
        return os.path.abspath(path)
    if os.path.exists(path) or encoder.startswith((".", "/", "~")) or not _HF_ID.match(encoder):
        raise ConfigError(
            f"encoder {encoder!r} is neither a local encoder directory nor a Hugging Face id like 'owner/name'"
        )
    return encoder


def _check_architecture(architecture: str) -> str:
    name = str(architecture).strip().lower()
    if name not in ARCHITECTURES:
        raise ConfigError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    return name


def _check_out(out: str | os.PathLike[str]) -> str:
    target = os.path.abspath(os.path.expanduser(os.fspath(out)))
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise ConfigError(f"--out {os.fspath(out)!r} exists and is not an empty directory; pass a new directory")
    return target


def _build(source: str, architecture: str, seed: int) -> Any:
    """gliner2's own construction from an encoder, its heads initialised under `seed`."""
    from gliner2 import AutoExtractor, ExtractorConfig

    from prefect_gliner2.training.tiny.encoder import isolated_rng

    try:
        with isolated_rng(seed):
            return AutoExtractor.from_config(ExtractorConfig(model_name=source, architecture=architecture))
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(
            f"cannot build a {architecture} model on encoder {source!r} ({type(exc).__name__}: {exc}); pass a "
            "directory with the encoder's config.json, weights and tokenizer files, or a Hugging Face id the local "
            "cache or the network can provide"
        ) from exc
