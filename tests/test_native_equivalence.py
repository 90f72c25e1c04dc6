"""The session adds no second optimizer loop: on the same batch order it reproduces native `train()` bit for bit.

gliner2's `ExtractorTrainer.train()` draws its batch order from its own samplers; here a test subclass hands it the
plan's order instead (collated by the native collator, lazily, exactly when `train()` iterates), and everything
else (loss, backward, accumulation, partial-window flush, clipping, AdamW, schedule) is native `train()` itself.
"""

from __future__ import annotations

import random

import pytest
import torch
from gliner2.training.trainer import ExtractorCollator, ExtractorDataset, ExtractorTrainer
from gliner2.training.trainer import TrainingConfig as NativeConfig

from prefect_gliner2.training import TrainingSession
from prefect_gliner2.training.engine import configure_sampling, private_python_rng

from support.session import CASE_IDS, CASES, make_config, make_model, make_plan, run_direct, train_records


class PlanOrderTrainer(ExtractorTrainer):
    """Native trainer whose training loader yields the plan's batches (test-only data order).

    Its preprocessing draws from a private `random.Random(seed)` exactly as a session's does (the global `random`
    of a pytest process is shared with Prefect's service threads from other test modules).
    """

    plan = None
    originals = None  # the caller's records as given (native train() never sees our copies of them)

    def _setup_seed(self):
        super()._setup_seed()
        self.python_rng = random.Random(self.config.seed)

    def _create_dataloader(self, dataset, batch_size, shuffle=True, is_training=True):
        collator = ExtractorCollator(
            self.processor,
            is_training=True,
            max_len=self.config.max_len or getattr(self.model.config, "max_len", None),
            architecture=getattr(self.model, "architecture", "span"),
            max_gold_per_query=(getattr(self.model.config, "boundary_head", None) or {}).get("max_gold_per_query", 32),
            on_capacity_exceeded="raise",
        )
        plan, originals = self.plan, self.originals
        rng = self.python_rng

        class Loader:
            sampler = None

            def __init__(self):
                self.epoch = 0

            def __len__(self):
                return plan.batches_per_epoch

            def __iter__(self):
                start = self.epoch * plan.batches_per_epoch
                self.epoch += 1
                for i in range(start, start + plan.batches_per_epoch):
                    examples = [originals[row] for row in plan.rows(i)]
                    with private_python_rng(rng):
                        collated = collator([(r["input"], r["output"]) for r in examples])
                    yield collated

        return Loader()

    def _save_checkpoint(self, name):  # the comparison reads live weights; keep the run's files out of it
        return None


@pytest.mark.parametrize(("arch", "lora"), CASES, ids=CASE_IDS)
def test_session_reproduces_native_train_bitwise(arch, lora, tmp_path):
    # negative labels are a data-level augmentation of the plan (augment.py) that native train() does not have; the
    # processor's sampling (entity label shuffling, synthetic labels) is gliner2's own and is compared as configured
    config = make_config(arch, lora, output_dir=str(tmp_path / "native"), negative_label_prob=0.0)
    plan = make_plan(arch, config)

    session = TrainingSession(make_model(arch), config, max_steps=plan.max_steps)
    run_direct(session, plan)
    ours = {n: p.detach().clone() for n, p in session.model.named_parameters()}
    session.close()

    native_kwargs = config.to_native_kwargs()
    native_kwargs.update(
        fp16=False,
        bf16=False,
        num_workers=0,
        pin_memory=False,
        report_to_wandb=False,
        group_by_length=False,
        save_best=False,
    )
    dataset = ExtractorDataset([record.to_dict() for record in plan.records], shuffle=False)
    native_model = make_model(arch)
    configure_sampling(
        native_model.processor,
        shuffle_entities=config.shuffle_entity_labels,
        synthetic_entity_label_prob=config.synthetic_entity_label_prob,
    )
    assert native_model.processor.sampling_config.shuffle_entities  # the default: entity labels shuffled
    trainer = PlanOrderTrainer(native_model, NativeConfig(**native_kwargs))
    trainer.plan, trainer.originals = plan, train_records()
    # the caller's key order is not sorted: the session must train on it as given, as native train() does
    assert any(list(r["output"]["entities"]) != sorted(r["output"]["entities"]) for r in trainer.originals)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    summary = trainer.train(train_data=dataset)
    assert summary["total_steps"] == plan.max_steps
    native = dict(trainer.model.named_parameters())
    assert sorted(native) == sorted(ours)
    differing = [n for n in ours if not torch.equal(ours[n], native[n].detach())]
    assert not differing, f"{len(differing)} parameters differ from native train(), e.g. {differing[:3]}"
    assert any(not torch.equal(initial[n], ours[n]) for n in ours)  # training really moved the weights
