"""Label identity under the default augmentation: a model trained with shuffled label orders still tells its labels
apart (issue 43's two-label case), on a BERT-style (absolute positions) and a DeBERTa-style (relative attention)
tiny encoder, in every label order; without label subsets the same run tags every mention with both labels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prefect_gliner2.session_core import ManagedTrainingPlan, TrainingConfig
from prefect_gliner2.session_core.evaluation import score_extraction
from prefect_gliner2.training import TrainingSession
from prefect_gliner2.training.tiny import build_tiny_model
from prefect_gliner2.training.tiny.data import two_label_records

from support.config import training_config

ENCODERS = {"bert": {"encoder": "bert"}, "deberta": {"encoder": "deberta-v2", "deberta_v3": True}}
ORDERS = 6  # seeded random label orders per held-out record, beside the data's own order
EPOCHS = 30  # label subsets in the first 15 (the default label_subset_until 0.5), both labels in every prompt after


def _train(encoder: str, epochs: int = EPOCHS, **overrides: Any) -> TrainingSession:
    """The tiny span model (hidden 64, 2 layers) trained on 160 two-label records (20 updates an epoch) with the
    default augmentation (labels shuffled per occurrence, negatives, synthetic labels, label subsets) and the test
    config's rates."""
    model = build_tiny_model("span", seed=0, hidden_size=64, num_layers=2, **ENCODERS[encoder])
    values = training_config(batch_size=8, gradient_accumulation_steps=1, num_epochs=epochs, eval_strategy="no")
    config = TrainingConfig(**{**values, "warmup_ratio": 0.1, **overrides})
    plan = ManagedTrainingPlan(two_label_records(160, seed=1), config, architecture="span")
    session = TrainingSession(model, config, max_steps=plan.max_steps)
    for i in range(plan.batch_count):
        session.forward_backward(plan.batch(i))
        if plan.is_update(i):
            session.optim_step()
    return session


def _f1_in_every_order(session: TrainingSession) -> list[float]:
    held_out = [(r["input"], r["output"]) for r in two_label_records(60, seed=2)]

    def extract(texts: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return session.extract(texts, schemas, threshold=0.5, batch_size=32)

    canonical = score_extraction(held_out, extract, label_order="canonical")
    shuffled = [score_extraction(held_out, extract, seed=3, trial=t) for t in range(ORDERS)]
    return [report.metrics()["eval_f1"] for report in (canonical, *shuffled)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is faster on one thread than split over two busy cores
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_default_augmentation_keeps_label_identity_in_every_order(encoder: str) -> None:
    f1s = _f1_in_every_order(_train(encoder))
    assert min(f1s) >= 0.99, f1s


def test_shuffling_without_label_subsets_erases_label_identity() -> None:
    """The control: the same run with label_subset_prob=0 learns one label-agnostic detector (every mention tagged
    with both labels: precision 0.5, recall 1, F1 about 0.667), in every order alike. Half the epochs show it: without
    subsets the runs measured for issue 43 stayed at 0.66-0.67 from 8 to 30 epochs."""
    f1s = _f1_in_every_order(_train("bert", epochs=EPOCHS // 2, label_subset_prob=0.0))
    assert max(f1s) < 0.75, f1s
