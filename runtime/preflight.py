"""The pre-flight check before training: a span model whose count head predicts 0 for every label stops the run.

gliner2 2.1.0 extracts an entity label (any structure) only when the span model's count head predicts a count above
zero, and it trains no count loss on entity tasks, so a model whose head predicts 0 extracts nothing at any threshold
however long it trains: every validation F1 is 0. ``check_count_head`` asks the model for a few training records'
labels with gliner2's own batched inference and reads the counts its head predicts (a forward hook, nothing
patched: ``training.engine.native``). All zero: the run stops with :class:`DeadCountHeadError` naming the fixes,
or, when the training config asks for it (``repair_count_head``), the head is pinned to one instance per label
(``engine.native.pin_count_head``: what ``prefect-gliner2 init-model`` does) and the check runs again.

It runs in the session worker on the loaded model before the training session is built, on every worker start (a
restore sees the same model, so the same repair keeps a LoRA base's hash); it draws no RNG and leaves the model's
mode and gradients as they were. Boundary models decode without a count head and are not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import DeadCountHeadError
from prefect_gliner2.session_core.scoring import DatasetSchema, inference_schema

__all__ = ["PROBE_RECORDS", "CountProbe", "check_count_head", "probe_count_head"]

PROBE_RECORDS = 8  # records asked: one batched extraction, about a second on a 22M-parameter encoder on CPU
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CountProbe:
    """The counts a span model's head predicted for the probe records' prompts (one per record and task)."""

    records: int
    counts: tuple[int, ...]

    @property
    def dead(self) -> bool:
        """True when the head was asked and said 0 every time (the model extracts nothing)."""
        return bool(self.counts) and not any(self.counts)


def probe_count_head(model: Any, examples: Sequence[dict[str, Any]], *, threshold: float = 0.5) -> CountProbe:
    """Extract the first PROBE_RECORDS `examples` (``{"input", "output"}`` records) with their data set's labels and
    record every count the model's count head predicts (``engine.native.count_predictions``)."""
    import torch
    from gliner2 import Schema

    from prefect_gliner2.training.engine.native import count_predictions
    from prefect_gliner2.training.tiny.encoder import isolated_rng

    probe = list(examples[:PROBE_RECORDS])
    outputs = [example["output"] for example in probe]
    dataset = DatasetSchema.of(outputs)
    schemas = [Schema.from_dict(inference_schema(output, dataset)) for output in outputs]
    was_training = model.training
    with count_predictions(model) as counts:
        if counts is None:
            return CountProbe(records=0, counts=())
        try:
            with isolated_rng(0), torch.no_grad():
                model.batch_extract(
                    [example["input"] for example in probe], schemas, batch_size=len(probe) or 1, threshold=threshold
                )
        finally:
            model.train(was_training)
    return CountProbe(records=len(probe), counts=tuple(counts))


def check_count_head(model: Any, examples: Sequence[dict[str, Any]], *, repair: bool, source: str) -> str | None:
    """Stop a span model that would extract nothing, or repair it when `repair` is set (see the module docstring).
    Returns a line saying what was repaired, None when nothing was."""
    from prefect_gliner2.training.engine.native import pin_count_head

    probe = probe_count_head(model, examples)
    if not probe.dead:
        _log.debug("pre-flight: count head of %s predicts %s on %d records", source, probe.counts, probe.records)
        return None
    if not repair:
        raise DeadCountHeadError(
            f"model {source}: its count head predicts 0 instances for every label on {probe.records} training "
            "records, so this span model extracts nothing at any threshold and every validation F1 would be 0 "
            "(gliner2 2.1.0 does not train that head on entity tasks). Build the model with `prefect-gliner2 "
            "init-model --encoder ENCODER --architecture span --out DIR` (it pins the head), or set "
            "repair_count_head: true in the training config to pin it to one instance per label for this run"
        )
    pin_count_head(model, 1)
    if probe_count_head(model, examples).dead:  # pragma: no cover - a pinned head predicts 1 whatever its input
        raise DeadCountHeadError(f"model {source}: the count head still predicts 0 after pinning it")
    message = (
        f"pre-flight: the count head of {source} predicted 0 for every label on {probe.records} records; "
        "repaired (repair_count_head): pinned to one instance per label"
    )
    _log.warning("%s", message)
    return message
