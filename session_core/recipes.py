"""Training recipes: the learning rates and warmup that suit where a run starts from, chosen by one setting.

``TrainingConfig.recipe`` names one; the fields it sets (``encoder_lr``, ``task_lr``, ``warmup_ratio``) take the
recipe's value unless given explicitly (a value given wins; ``None`` means "the recipe's").

- ``"gliner2"`` (the default): continue training a trained GLiNER2 model (a released checkpoint or a model this
  product exported). gliner2's own defaults: the encoder at 1e-5, the task heads at 5e-4, 10% warmup.
- ``"from-encoder"``: a model that ``prefect-gliner2 init-model`` built on a pretrained encoder: fresh, randomly
  initialised task heads and special-token embeddings on an encoder that has never seen gliner2's prompt. At 1e-5
  the encoder barely moves, so the heads learn a label-agnostic detector whose validation F1 swings between 0 and
  0.2 from epoch to epoch (issue 43, all-MiniLM-L6-v2 on 700 news sentences). The recipe trains the encoder at the
  rate that fine-tunes the same encoder into a BIO token classifier reaching 0.65 micro F1 on those sentences
  (5e-5) and the fresh heads at twice gliner2's default (1e-3); a head rate of 5e-3 made the heads' loss diverge
  within 4 updates (bench/realdata.py, an earlier run), and 10% warmup is kept. Measured (``bench/realdata.py
  --set recipe=from-encoder``, MiniLM, 200 training records, 3 epochs = 75 updates, 3 seeds, held-out micro F1
  against the same encoder fine-tuned as a BIO token classifier for 5 epochs; docs/benchmarks.md): WNUT-16 tweets
  0.337 vs 0.389 (0.87x; gliner2's own trainer with the same settings 0.266), no label at 0; CoNLL-2003 news 0.266
  vs 0.394 (0.67x; gliner2's trainer 0.253). Neither diverged. At this budget the model finds the spans but does
  not yet tell labels apart on real text (most false positives are another label's mentions); whether a longer
  run, a stronger label-subset schedule or another head rate fixes that is not measured yet.

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
