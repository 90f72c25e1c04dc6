"""The base-weights hash a session records (and a LoRA restore checks): BLAKE3 now, and LoRA checkpoints that
recorded the older plain sha256 still resume on the same base and are refused on another."""

from __future__ import annotations

import pytest
import torch

from prefect_gliner2.training import StateMismatchError, TrainingSession
from prefect_gliner2.training.state import (
    WEIGHTS_DIGEST_PREFIX,
    base_weights,
    same_base_weights,
    tensors_digest,
    weights_digest,
)

from support.session import assert_bitwise_equal, make_config, make_model, make_plan, run_direct, snapshot


def new_session(arch: str, lora: bool):
    config = make_config(arch, lora)
    plan = make_plan(arch, config)
    return TrainingSession(make_model(arch), config, max_steps=plan.max_steps), plan


def test_a_lora_checkpoint_recorded_with_the_older_sha256_base_hash_still_resumes_and_checks_its_base(tmp_path):
    """Base hashes are BLAKE3 now (``blake3:<hex>``); a LoRA checkpoint written before records the plain sha256 of the
    same framing, and still resumes on the same base (bit for bit) and is still refused on another base."""
    session, plan = new_session("span", True)
    current = session.provenance["base_model_hash"]
    assert current.startswith(WEIGHTS_DIGEST_PREFIX) and len(current) == len(WEIGHTS_DIGEST_PREFIX) + 64
    assert current == weights_digest(base_weights(new_session("span", True)[0].model))  # same weights, same hash
    legacy = tensors_digest(base_weights(session.model))
    assert len(legacy) == 64 and legacy != current
    session.provenance["base_model_hash"] = legacy  # what the older version recorded in the checkpoint's compat
    run_direct(session, plan, stop=4)
    session.save_state(str(tmp_path / "ckpt"))
    tail = run_direct(session, plan, start=4)
    expected = snapshot(session)

    resumed, _ = new_session("span", True)
    resumed.load_state(str(tmp_path / "ckpt"))
    assert run_direct(resumed, plan, start=4) == tail
    assert_bitwise_equal(snapshot(resumed), expected)

    other, _ = new_session("span", True)
    with torch.no_grad():
        next(p for n, p in other.model.named_parameters() if "lora_" not in n).add_(1.0)  # another base model
    other.provenance["base_model_hash"] = weights_digest(base_weights(other.model))
    with pytest.raises(StateMismatchError, match="base_model_hash"):
        other.load_state(str(tmp_path / "ckpt"))
    assert not same_base_weights(legacy, other.provenance["base_model_hash"], other.model)
    assert same_base_weights(legacy, current, session.model)
    assert not same_base_weights(WEIGHTS_DIGEST_PREFIX + "0" * 64, current, session.model)  # no fallback for BLAKE3
