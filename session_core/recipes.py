"""Training recipes: the learning rates and warmup that suit where a run starts from, chosen by one setting.

``TrainingConfig.recipe`` names one; the fields it sets (``encoder_lr``, ``task_lr``, ``warmup_ratio``) take the
recipe's value unless given explicitly (a value given wins; ``None`` means "the recipe's").

- ``"gliner2"`` (the default): continue training a trained GLiNER2 model (a released checkpoint or a model this
  product exported). gliner2's own defaults: the encoder at 1e-5, the task heads at 5e-4, 10% warmup.
- ``"from-encoder"``: a model that ``prefect-gliner2 init-model`` built on a pretrained encoder: fresh, randomly
  initialised task heads and special-token embeddings on an encoder that has never seen gliner2's prompt. At 1e-5
  the encoder barely moves, so the heads learn a label-agnostic detector whose validation F1 swings between 0 and
  0.2 from epoch to epoch (issue 43). The recipe trains the encoder as fast as a fine-tuned token classifier is
  trained (5e-5) and the heads twice as fast as gliner2's default (1e-3), with the same 10% warmup. It was chosen by
  measuring on all-MiniLM-L6-v2 and WNUT-16 tweets (bench/realdata.py; the figures are in the README's init-model
  section): a higher head rate (5e-3) made the fresh heads' loss diverge within a few updates.

Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["DEFAULT_RECIPE", "RECIPES", "RECIPE_FIELDS", "recipe_values"]

DEFAULT_RECIPE = "gliner2"
#: The fields a recipe sets.
RECIPE_FIELDS: tuple[str, ...] = ("encoder_lr", "task_lr", "warmup_ratio")
RECIPES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "gliner2": MappingProxyType({"encoder_lr": 1e-5, "task_lr": 5e-4, "warmup_ratio": 0.1}),
        "from-encoder": MappingProxyType({"encoder_lr": 5e-5, "task_lr": 1e-3, "warmup_ratio": 0.1}),
    }
)


def recipe_values(name: str) -> Mapping[str, float]:
    """The values recipe `name` gives its fields; a KeyError for an unknown name (the config check reports it)."""
    return RECIPES[name]
