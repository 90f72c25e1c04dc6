"""TrainingSession qualification: span/boundary x full/LoRA on real tiny models, bitwise where it matters."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from prefect_gliner2.training import (
    AdapterMismatchError,
    CheckpointError,
    ConfigError,
    ManagedTrainingPlan,
    PrecisionError,
    RecordError,
    SessionStateError,
    StateMismatchError,
    TrainingNumericsError,
    TrainingSession,
    WeightsError,
    load_exported_model,
)

from support.session import (
    CASE_IDS,
    CASES,
    assert_bitwise_equal,
    make_config,
    make_model,
    make_plan,
    new_session,
    run_child,
    run_direct,
    snapshot,
    train_records,
)


@pytest.mark.parametrize(("arch", "lora"), CASES, ids=CASE_IDS)
def test_exact_continuation_in_a_fresh_process_from_mid_window(arch, lora, tmp_path):
    session, plan = new_session(arch, lora)
    cut = 6  # second epoch, batches 5 and 6 of a 3-micro-batch window are pending
    run_direct(session, plan, stop=cut + 1)
    assert session.pending_micro_batches == 2
    session.save_state(str(tmp_path / "ckpt"))
    tail = run_direct(session, plan, start=cut + 1)
    expected = snapshot(session)
    assert session.step == plan.max_steps

    child = run_child(
        "session_child",
        {
            "arch": arch,
            "lora": lora,
            "mode": "direct",
            "start": cut + 1,
            "checkpoint": str(tmp_path / "ckpt"),
            "out": str(tmp_path / "out.st"),
        },
        interpreter=(arch, lora) == CASES[0],  # one case in a fresh interpreter, the others forked (support.forkserver)
    )
    assert child["losses"] == tail
    assert child["step"] == plan.max_steps
    assert_bitwise_equal(safetensors.torch.load_file(str(tmp_path / "out.st")), expected)


@pytest.mark.parametrize(("arch", "lora"), [("span", False), ("boundary", True)], ids=["span-full", "boundary-lora"])
def test_forward_leaves_training_unperturbed(arch, lora):
    plain, plan = new_session(arch, lora)
    plain_losses = run_direct(plain, plan)
    probed, _ = new_session(arch, lora)
    probe = train_records(3)
    losses = []
    for i in range(plan.batch_count):
        alone = threading.active_count() == 1  # else Prefect service threads of other modules may draw `random`
        rng_before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        private_before = probed.engine.python_rng.getstate()
        value = probed.forward(probe)
        assert isinstance(value, float) and np.isfinite(value)
        assert probed.engine.python_rng.getstate() == private_before
        assert random.getstate() == rng_before[0] or not alone
        assert np.array_equal(np.random.get_state()[1], rng_before[1])
        assert torch.equal(torch.get_rng_state(), rng_before[2])
        assert probed.model.training
        losses.append(probed.forward_backward(plan.batch(i)))
        if plan.is_update(i):
            probed.optim_step()
    assert losses == plain_losses
    assert_bitwise_equal(snapshot(probed), snapshot(plain))


@pytest.mark.parametrize(("arch", "lora"), CASES, ids=CASE_IDS)
def test_native_export_round_trip_predicts_like_the_live_model(arch, lora, tmp_path):
    session, plan = new_session(arch, lora)
    run_direct(session, plan, stop=6)
    info = session.export_weights(str(tmp_path / "export"), merged=lora)
    assert info["step"] == session.step
    exported = load_exported_model(str(tmp_path / "export"))
    live_before = snapshot(session)
    exported.eval()
    session.model.eval()
    with torch.no_grad():
        for record in train_records(6):
            labels = sorted(record["output"]["entities"])
            expected = session.model.extract_entities(record["input"], labels, threshold=0.0, include_confidence=True)
            assert (
                exported.extract_entities(record["input"], labels, threshold=0.0, include_confidence=True) == expected
            )
    session.model.train()
    if lora:
        assert (tmp_path / "export" / "adapter" / "adapter_config.json").exists()
        from gliner2 import AutoExtractor

        merged = AutoExtractor.from_pretrained(str(tmp_path / "export" / "merged"))
        base = AutoExtractor.from_pretrained(str(tmp_path / "export"))
        assert sorted(merged.state_dict()) == sorted(base.state_dict())
        assert not all(torch.equal(merged.state_dict()[k], v) for k, v in base.state_dict().items())
    else:
        live = session.model.state_dict()
        saved = safetensors.torch.load_file(str(tmp_path / "export" / "model.safetensors"))
        assert sorted(saved) == sorted(live) and all(torch.equal(live[k].cpu(), saved[k]) for k in live)
    assert_bitwise_equal(snapshot(session), live_before)


def test_trained_model_export_starts_another_run(tmp_path):
    session, plan = new_session("span", False)
    run_direct(session, plan)
    session.export_weights(str(tmp_path / "trained"))
    from gliner2 import AutoExtractor

    model = AutoExtractor.from_pretrained(str(tmp_path / "trained"))
    config = make_config("span", False)
    second = TrainingSession(model, config, max_steps=plan.max_steps)
    first_weights = {k: v.clone() for k, v in session.model.state_dict().items()}
    assert all(torch.equal(first_weights[k], v) for k, v in second.model.state_dict().items())
    losses = run_direct(second, plan)
    assert all(np.isfinite(losses)) and second.step == plan.max_steps


@pytest.mark.parametrize("arch", ["span", "boundary"])
def test_preloaded_adapter_continues_without_reinitialisation(arch, tmp_path):
    from peft import PeftModel

    session, plan = new_session(arch, True)
    run_direct(session, plan, stop=6)
    session.export_weights(str(tmp_path / "export"))
    trained = {n: p.detach().clone() for n, p in session.model.named_parameters() if p.requires_grad}

    base = make_model(arch)
    preloaded = PeftModel.from_pretrained(base, str(tmp_path / "export" / "adapter"), is_trainable=True)
    again = TrainingSession(preloaded, make_config(arch, True), max_steps=plan.max_steps)
    live = {n: p for n, p in again.model.named_parameters() if p.requires_grad}
    assert sorted(live) == sorted(trained)
    assert all(torch.equal(live[n], trained[n]) for n in trained)
    losses = run_direct(again, plan)
    assert all(np.isfinite(losses))

    with pytest.raises(AdapterMismatchError, match="lora_r"):
        mismatched = PeftModel.from_pretrained(
            make_model(arch), str(tmp_path / "export" / "adapter"), is_trainable=True
        )
        TrainingSession(mismatched, make_config(arch, True, lora_r=8), max_steps=plan.max_steps)
    with pytest.raises(AdapterMismatchError, match="inference mode"):
        frozen = PeftModel.from_pretrained(make_model(arch), str(tmp_path / "export" / "adapter"))
        TrainingSession(frozen, make_config(arch, True), max_steps=plan.max_steps)
    with pytest.raises(AdapterMismatchError, match="use_lora=False"):
        TrainingSession(
            PeftModel.from_pretrained(make_model(arch), str(tmp_path / "export" / "adapter"), is_trainable=True),
            make_config(arch, False),
            max_steps=plan.max_steps,
        )


def _fresh_rng(session):
    """The RNG streams a session trains with: its private Python stream (the global `random` of a pytest process
    is also drawn by Prefect's service threads left by other test modules), NumPy's and Torch's."""
    return session.engine.python_rng.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()


@pytest.mark.parametrize(("arch", "lora"), [("span", False), ("boundary", True)], ids=["span-full", "boundary-lora"])
def test_load_weights_from_checkpoint_keeps_a_fresh_run(arch, lora, tmp_path):
    trained, plan = new_session(arch, lora)
    run_direct(trained, plan, stop=7)
    trained.save_state(str(tmp_path / "ckpt"))
    weights = {n: p.detach().clone() for n, p in trained.model.named_parameters()}

    reference, _ = new_session(arch, lora)
    reference_rng = _fresh_rng(reference)
    fresh, _ = new_session(arch, lora)
    report = fresh.load_weights(str(tmp_path / "ckpt"))
    assert report["kind"] == "checkpoint"
    rng = _fresh_rng(fresh)
    assert (
        rng[0] == reference_rng[0]
        and np.array_equal(rng[1], reference_rng[1])
        and torch.equal(rng[2], reference_rng[2])
    )
    assert all(torch.equal(p, weights[n]) for n, p in fresh.model.named_parameters())
    assert fresh.step == 0 and fresh.pending_micro_batches == 0
    assert fresh.engine.optimizer.state_dict()["state"] == {}
    assert all(p.grad is None for p in fresh.model.parameters())
    assert fresh.engine.scheduler.last_epoch == reference.engine.scheduler.last_epoch
    # the new run then trains exactly like a fresh session whose weights were set the same way
    assert np.isfinite(run_direct(fresh, plan, stop=3)).all()
    with pytest.raises(SessionStateError, match="fresh"):
        fresh.load_weights(str(tmp_path / "ckpt"))


def test_load_weights_native_single_and_sharded_and_adapter_dirs(tmp_path):
    trained, plan = new_session("span", False)
    run_direct(trained, plan, stop=4)
    trained.export_weights(str(tmp_path / "single"))
    expected = {k: v.clone() for k, v in trained.model.state_dict().items()}

    single, _ = new_session("span", False)
    assert single.load_weights(str(tmp_path / "single"))["kind"] == "native"
    assert all(torch.equal(v, expected[k]) for k, v in single.model.state_dict().items())

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("config.json",):
        (sharded / name).write_bytes((tmp_path / "single" / name).read_bytes())
    tensors = safetensors.torch.load_file(str(tmp_path / "single" / "model.safetensors"))
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for shard, keys in halves.items():
        safetensors.torch.save_file({k: tensors[k] for k in keys}, str(sharded / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    from_shards, _ = new_session("span", False)
    assert from_shards.load_weights(str(sharded))["kind"] == "native"
    assert all(torch.equal(v, expected[k]) for k, v in from_shards.model.state_dict().items())

    lora, lora_plan = new_session("span", True)
    run_direct(lora, lora_plan, stop=4)
    lora.export_weights(str(tmp_path / "lora"))
    adapter = {n: p.detach().clone() for n, p in lora.model.named_parameters() if p.requires_grad}
    target, _ = new_session("span", True)
    assert target.load_weights(str(tmp_path / "lora" / "adapter"))["kind"] == "adapter"
    assert all(torch.equal(p, adapter[n]) for n, p in target.model.named_parameters() if p.requires_grad)

    wrong_rank, _ = new_session("span", True, lora_r=2)
    with pytest.raises(AdapterMismatchError, match="lora_r"):
        wrong_rank.load_weights(str(tmp_path / "lora" / "adapter"))
    boundary, _ = new_session("boundary", False)
    before = snapshot(boundary)
    with pytest.raises(WeightsError, match="'span' model"):
        boundary.load_weights(str(tmp_path / "single"))
    assert_bitwise_equal(snapshot(boundary), before)
    with pytest.raises(WeightsError, match="none of"):
        boundary.load_weights(str(tmp_path))


def test_full_model_seeds_fresh_adapters(tmp_path):
    trained, plan = new_session("span", False)
    run_direct(trained, plan, stop=4)
    trained.export_weights(str(tmp_path / "full"))
    lora, _ = new_session("span", True)
    lora.load_weights(str(tmp_path / "full"))
    base = {
        k.replace("base_model.model.", "").replace(".base_layer.", "."): v
        for k, v in lora.model.state_dict().items()
        if "lora_" not in k
    }
    expected = trained.model.state_dict()
    assert all(torch.equal(base[k], expected[k]) for k in expected)
    assert lora.provenance["base_model_hash"] != new_session("span", True)[0].provenance["base_model_hash"]


# ---- rejections -------------------------------------------------------------------------------------------


def test_fp16_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="fp16"):
        make_config("span", False, fp16=True)


def test_cpu_bf16_is_refused_at_session_creation():
    config = make_config("span", False, bf16=True)  # a CPU control plane may plan a bf16 run
    with pytest.raises(PrecisionError, match="CPU mixed precision"):
        TrainingSession(make_model("span"), config, max_steps=3, device="cpu")


def test_load_state_rejects_changed_config_threads_and_non_fresh(tmp_path):
    session, plan = new_session("span", False)
    run_direct(session, plan, stop=2)
    session.save_state(str(tmp_path / "ckpt"))
    changed, _ = new_session("span", False, encoder_lr=5e-4)
    with pytest.raises(StateMismatchError, match="encoder_lr"):
        changed.load_state(str(tmp_path / "ckpt"))
    other_arch, _ = new_session("boundary", False)
    with pytest.raises(StateMismatchError, match="architecture"):
        other_arch.load_state(str(tmp_path / "ckpt"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        fresh, _ = new_session("span", False)
        with pytest.raises(StateMismatchError, match="cpu_threads"):
            fresh.load_state(str(tmp_path / "ckpt"))
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(SessionStateError, match="fresh"):
        session.load_state(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="immutable"):
        session.save_state(str(tmp_path / "ckpt"))


def _damaged_copy(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_tampered_truncated_and_pickled_checkpoints_are_rejected(tmp_path):
    session, plan = new_session("span", False)
    run_direct(session, plan, stop=2)
    good = tmp_path / "good"
    session.save_state(str(good))

    edited = _damaged_copy(good, tmp_path / "edited")
    data = bytearray((edited / "weights.safetensors").read_bytes())
    data[-1] ^= 0x01
    (edited / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its recorded blake3"):
        new_session("span", False)[0].load_state(str(edited))

    truncated = _damaged_copy(good, tmp_path / "truncated")
    (truncated / "optimizer.pt").write_bytes((truncated / "optimizer.pt").read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        new_session("span", False)[0].load_state(str(truncated))

    missing_index = _damaged_copy(good, tmp_path / "incomplete")
    (missing_index / "checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        new_session("span", False)[0].load_state(str(missing_index))

    pickled = _damaged_copy(good, tmp_path / "pickled")
    import hashlib
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    payload = pickle.dumps({"state": {}, "param_groups": [], "x": Evil()})
    (pickled / "optimizer.pt").write_bytes(payload)
    index = json.loads((pickled / "checkpoint.json").read_text())
    index["files"]["optimizer.pt"] = {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
    (pickled / "checkpoint.json").write_text(json.dumps(index))
    victim, _ = new_session("span", False)
    with pytest.raises(CheckpointError, match="weights_only"):
        victim.load_state(str(pickled))


def test_optim_step_refuses_past_max_steps_and_without_gradients():
    session, plan = new_session("span", False)
    with pytest.raises(SessionStateError, match="no pending"):
        session.optim_step()
    run_direct(session, plan)
    with pytest.raises(SessionStateError, match="planned update"):
        session.forward_backward(plan.batch(0))


def test_non_finite_loss_and_gradients_are_errors_not_zeros():
    session, plan = new_session("span", False)
    with torch.no_grad():
        session.model.encoder.embeddings.LayerNorm.weight.fill_(float("nan"))
    with pytest.raises(TrainingNumericsError, match="non-finite loss"):
        session.forward_backward(plan.batch(0))
    with pytest.raises(SessionStateError, match="unusable"):
        session.forward_backward(plan.batch(1))

    for poison in (float("inf"), float("nan")):  # one poisoned gradient: the whole update is refused
        session, plan = new_session("span", False)
        parameter = next(p for n, p in session.model.named_parameters() if "span_rep" in n)
        before = {n: t.detach().clone() for n, t in session.model.state_dict().items()}
        handle = parameter.register_hook(lambda grad, poison=poison: grad * poison)
        session.forward_backward(plan.batch(0))
        handle.remove()
        with pytest.raises(TrainingNumericsError, match="non-finite gradients"):
            session.optim_step()
        assert all(torch.equal(t, before[n]) for n, t in session.model.state_dict().items())
        assert session.step == 0 and not session.engine.optimizer.state  # no AdamW moment was written either
        with pytest.raises(SessionStateError, match="unusable"):
            session.optim_step()


def test_a_sample_the_model_cannot_process_is_an_error(monkeypatch):
    session, plan = new_session("span", False)
    base = session.model
    original = base._compute_sample_loss
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("cannot score this sample")
        return original(*args, **kwargs)

    monkeypatch.setattr(base, "_compute_sample_loss", flaky)
    with pytest.raises(RecordError, match="could not process 1 of 2"):
        session.forward_backward(plan.batch(0))
    assert all(p.grad is None for p in session.model.parameters())


def test_lora_activation_checkpointing_is_non_reentrant_and_reaches_encoder_adapters():
    session, plan = new_session("span", True, gradient_checkpointing=True)
    session.forward_backward(plan.batch(0))
    encoder_grads = [
        p.grad
        for n, p in session.model.named_parameters()
        if p.requires_grad and "encoder.encoder.layer" in n and "lora_B" in n
    ]
    assert encoder_grads and all(g is not None and bool(g.abs().sum() > 0) for g in encoder_grads)


def test_trainer_factory_buffers_ride_in_the_same_checkpoint(tmp_path):
    from gliner2.training.trainer import ExtractorTrainer

    class BufferTrainer(ExtractorTrainer):
        def _backward_one(self, batch, step, use_amp, amp_dtype, *, is_last_micro=True):
            if not hasattr(self, "seen"):
                self.seen = torch.zeros(1, dtype=torch.long)
            self.seen += 1
            return super()._backward_one(batch, step, use_amp, amp_dtype, is_last_micro=is_last_micro)

        def session_state_dict(self):
            return {"seen": getattr(self, "seen", torch.zeros(1, dtype=torch.long)).clone()}

        def load_session_state_dict(self, state):
            self.seen = state["seen"].clone()

    config = make_config("span", False)
    plan = make_plan("span", config)
    session = TrainingSession(make_model("span"), config, max_steps=plan.max_steps, trainer_factory=BufferTrainer)
    run_direct(session, plan, stop=5)
    session.save_state(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "trainer_extra.pt").exists()
    run_direct(session, plan, start=5)  # finish first: sessions share the process-global RNGs
    resumed = TrainingSession(make_model("span"), config, max_steps=plan.max_steps, trainer_factory=BufferTrainer)
    resumed.load_state(str(tmp_path / "ckpt"))
    assert int(resumed.engine.seen) == 5
    run_direct(resumed, plan, start=5)
    assert int(resumed.engine.seen) == int(session.engine.seen) == plan.batch_count
    assert_bitwise_equal(snapshot(resumed), snapshot(session))
    plain = TrainingSession(make_model("span"), config, max_steps=plan.max_steps)
    with pytest.raises(StateMismatchError, match="trainer"):
        plain.load_state(str(tmp_path / "ckpt"))


def test_checkpoints_and_exports_work_on_any_fsspec_storage():
    import fsspec

    session, plan = new_session("boundary", False)
    run_direct(session, plan, stop=4)
    session.save_state("memory://sessions/ckpt")
    tail = run_direct(session, plan, start=4)
    expected = snapshot(session)
    session.export_weights("memory://sessions/export")
    fs = fsspec.filesystem("memory")
    assert fs.exists("/sessions/export/model.safetensors") and fs.exists("/sessions/export/export.json")
    resumed, _ = new_session("boundary", False)
    resumed.load_state("memory://sessions/ckpt")
    assert run_direct(resumed, plan, start=4) == tail
    assert_bitwise_equal(snapshot(resumed), expected)
    assert load_exported_model("memory://sessions/export").architecture == "boundary"


def test_checkpoint_meta_reads_the_index_only(tmp_path):
    from prefect_gliner2.session_core.checkpoint import checkpoint_meta

    session, plan = new_session("span", False)
    run_direct(session, plan, stop=2)
    assert checkpoint_meta(str(tmp_path / "none")) is None
    session.save_state(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "weights.safetensors").write_bytes(b"damaged")  # not read by checkpoint_meta
    meta = checkpoint_meta(str(tmp_path / "ckpt"))
    assert meta["kind"] == "session" and meta["step"] == session.step and meta["pending_micro_batches"] == 2


@pytest.mark.parametrize("arch", ["span", "boundary"])
def test_other_users_of_the_global_random_module_cannot_shift_training(arch):
    """Prefect's service threads draw from `random`; a session's preprocessing has its own stream."""
    plain, plan = new_session(arch, True)
    expected_losses = run_direct(plain, plan)
    expected = snapshot(plain)
    noisy, _ = new_session(arch, True)
    losses = []
    for i in range(plan.batch_count):
        random.random(), random.shuffle(list(range(10)))  # another thread's draws, between operations
        losses.append(noisy.forward_backward(plan.batch(i)))
        if plan.is_update(i):
            noisy.optim_step()
    assert losses == expected_losses
    assert_bitwise_equal(snapshot(noisy), expected)


def _every_task_kind(n: int) -> list[dict]:
    """Records with entities (and a negative type), descriptions, a classification, a structure with a choice field
    and two relations, keys in no particular order: what real datasets hold beyond the tiny entity records."""
    people, firms, cities = ("alice smith", "bob jones", "carol brown"), ("acme", "globex", "hooli"), ("paris", "rome")
    out = []
    for i in range(n):
        person, firm, city = people[i % 3], firms[(i + 1) % 3], cities[i % 2]
        out.append(
            {
                "input": f"{person} works at {firm} in {city} .",
                "output": {
                    "relations": [
                        {"works_at": {"head": person, "tail": firm}},
                        {"located_in": {"head": firm, "tail": city}},
                    ],
                    "entities": {"person": [person], "company": [firm], "city": [city], "day": []},
                    "entity_descriptions": {"person": "a human"},
                    "json_structures": [
                        {
                            "job": {
                                "employer": firm,
                                "employee": person,
                                "kind": {"value": "full", "choices": ["part", "full"]},
                            }
                        }
                    ],
                    "classifications": [{"task": "topic", "labels": ["work", "sport"], "true_label": ["work"]}],
                },
            }
        )
    return out


@pytest.mark.parametrize(("arch", "lora"), [("span", True), ("boundary", False)], ids=["span-lora", "boundary-full"])
def test_every_task_kind_trains_and_continues_exactly(arch, lora, tmp_path):
    config = make_config(arch, lora)
    plan = ManagedTrainingPlan(_every_task_kind(7), config, architecture=arch)
    session = TrainingSession(make_model(arch), config, max_steps=plan.max_steps)
    cut = 4  # mid-window in the first epoch
    head = run_direct(session, plan, stop=cut + 1)
    session.save_state(str(tmp_path / "ckpt"))
    tail = run_direct(session, plan, start=cut + 1)
    assert all(np.isfinite(loss) for loss in head + tail) and session.step == plan.max_steps
    expected = snapshot(session)
    session.close()

    resumed = TrainingSession(make_model(arch), config, max_steps=plan.max_steps)
    resumed.load_state(str(tmp_path / "ckpt"))
    assert run_direct(resumed, plan, start=cut + 1) == tail
    assert_bitwise_equal(snapshot(resumed), expected)


@pytest.mark.parametrize(("arch", "lora"), CASES, ids=CASE_IDS)
def test_a_deberta_v2_encoder_trains_and_continues_exactly(arch, lora, tmp_path):
    """The released GLiNER2 models use DeBERTa-v2 encoders (relative attention): same exactness as the BERT ones."""
    from prefect_gliner2.training.tiny import build_tiny_model

    def model():
        return build_tiny_model(arch, seed=3, dropout=0.1, num_layers=2, encoder="deberta-v2")

    assert model().encoder.config.model_type == "deberta-v2"
    config = make_config(arch, lora)
    plan = make_plan(arch, config)
    session = TrainingSession(model(), config, max_steps=plan.max_steps)
    run_direct(session, plan, stop=7)  # second epoch, mid-window
    assert session.pending_micro_batches == 2
    session.save_state(str(tmp_path / "ckpt"))
    tail = run_direct(session, plan, start=7)
    expected = snapshot(session)
    session.close()

    resumed = TrainingSession(model(), config, max_steps=plan.max_steps)
    resumed.load_state(str(tmp_path / "ckpt"))
    assert run_direct(resumed, plan, start=7) == tail
    assert_bitwise_equal(snapshot(resumed), expected)


@pytest.mark.parametrize("arch", ["span", "boundary"])
def test_key_order_inside_a_record_changes_the_native_loss(arch):
    """Why records keep their key order: gliner2 builds the schema in dict order, so the same record with its entity
    types in another order is a different input (eval-mode loss, no RNG involved)."""
    text = "alice smith met bob jones in paris on monday at acme ."
    given = {"person": ["alice smith", "bob jones"], "city": ["paris"], "company": ["acme"]}
    reordered = {key: given[key] for key in sorted(given)}
    session, _ = new_session(arch, False)
    first = session.forward([{"input": text, "output": {"entities": given}}])
    second = session.forward([{"input": text, "output": {"entities": reordered}}])
    assert list(given) != list(reordered) and first != second
