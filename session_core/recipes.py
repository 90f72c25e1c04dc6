"""Training recipes: the learning rates, warmup and epochs that suit where a run starts from, chosen by one setting.

``TrainingConfig.recipe`` names one; the fields it sets (``encoder_lr``, ``task_lr``, ``warmup_ratio``, ``num_epochs``)
take the recipe's value unless given explicitly (a value given wins; ``None`` means "the recipe's").

- ``"gliner2"`` (the default): continue training a trained GLiNER2 model (a released checkpoint or a model this
  product exported). gliner2's own defaults: the encoder at 1e-5, the task heads at 5e-4, 10% warmup; 10 epochs.
- ``"from-encoder"``: a model that ``prefect-gliner2 init-model`` built on a pretrained encoder: fresh, randomly
  initialised task heads and special-token embeddings on an encoder that has never seen gliner2's prompt. At 1e-5
  the encoder barely moves, so the heads learn a label-agnostic detector whose validation F1 swings between 0 and
  0.2 from epoch to epoch (issue 43, all-MiniLM-L6-v2 on 700 news sentences). The recipe trains the encoder at the
  rate that fine-tunes the same encoder into a BIO token classifier reaching 0.65 micro F1 on those sentences
  (5e-5) and the fresh heads at twice gliner2's default (1e-3); a head rate of 5e-3 made the heads' loss diverge
  within 4 updates (bench/realdata.py, an earlier run); 10% warmup is kept; encoder rates of 1e-4 (0.260 against
  0.283 at 3 epochs) and a frozen encoder with heads at 3e-3 (0.267 at 10 epochs) were worse. 20 epochs, because
  label identity comes late: a model starts label-agnostic (every label scores every mention alike) and learns to
  tell labels apart only after hundreds of updates. On CoNLL-2003 news (``bench/realdata.py --corpus conll2003``,
  200 sentences, batch 8, seed 0, the entity marker seeded by init-model) the held-out micro F1 was 0.246 after 3
  epochs, 0.351 after 10 and 0.558 after 20 (the same encoder as a BIO token classifier, 5 epochs: 0.403); with
  the marker left at transformers' draw, 0.283 / 0.309 / 0.331 and every label answering the same spans. Over 3
  seeds at 20 epochs (``bench/realdata.py --corpus conll2003``; docs/benchmarks.md): micro F1 0.530 [0.510-0.558]
  against the token classifier's 0.394 (1.34x) and gliner2's own trainer's 0.286, every label above both. On much
  larger data fewer epochs give as many updates: set ``num_epochs`` (or ``max_steps``) and ``early_stopping``.

Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["DEFAULT_RECIPE", "RECIPES", "RECIPE_FIELDS", "recipe_values"]

DEFAULT_RECIPE = "gliner2"
#: The fields a recipe sets.
RECIPE_FIELDS: tuple[str, ...] = ("encoder_lr", "task_lr", "warmup_ratio", "num_epochs")
RECIPES: Mapping[str, Mapping[str, float | int]] = MappingProxyType(
    {
        "gliner2": MappingProxyType({"encoder_lr": 1e-5, "task_lr": 5e-4, "warmup_ratio": 0.1, "num_epochs": 10}),
        "from-encoder": MappingProxyType({"encoder_lr": 5e-5, "task_lr": 1e-3, "warmup_ratio": 0.1, "num_epochs": 20}),
    }
)


def recipe_values(name: str) -> Mapping[str, float | int]:
    """The values recipe `name` gives its fields; a KeyError for an unknown name (the config check reports it)."""
    return RECIPES[name]
