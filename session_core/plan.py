"""Content-addressed training plan: which rows form each batch, and where updates, epochs and validations fall.

Algorithm, version ``PLAN_ALGORITHM_VERSION = 3`` (any change to it must bump the version; v2 added negative
labels, v3 label subsets):

Random stream. ``random_keys(seed, epoch, purpose, count)`` returns ``count`` unsigned 64-bit keys: key ``j`` is
bytes ``[8j, 8j + 8)``, read little-endian, of SHAKE-256 of the ASCII string
``"prefect-gliner2/plan/v1/{purpose}/seed={seed}/epoch={epoch}"``. It never touches ``random``, ``hash()`` or
set order, so it is identical across processes, platforms, Python versions and ``PYTHONHASHSEED``.

Row order of epoch ``e`` (0-based): rows ``0..n-1`` sorted by the top 53 bits (``key >> 11``, exact as a double)
of their key from ``random_keys(seed, e, "rows", n)``, ties by row index (a stable sort).

Length grouping, only when ``config.group_by_length`` and ``architecture == "boundary"`` (gliner2's native trainer
length-groups boundary models only): the shuffled order is cut into windows of ``length_group_window_batches *
batch_size`` rows; each window is stably sorted by input text length (characters) and cut into batches of
``batch_size``. Only the last window can leave a partial batch. The full batches are reordered by sorting batch
positions ``0..F-1`` the same way by their keys from ``random_keys(seed, e, "batches", F)``; the partial batch
stays last.

Batches: epoch ``e``'s order is cut into ``P = ceil(n / batch_size)`` batches; the final partial batch is kept,
so every epoch covers every row exactly once. Global batch ``i`` is epoch ``i // P``, position ``i % P``.

Updates: accumulation windows of ``A = gradient_accumulation_steps`` batches restart at every epoch; a batch is an
update when it closes a window (``(pos + 1) % A == 0``) or ends the epoch (the partial window is flushed), so an
epoch has ``U = ceil(P / A)`` updates. ``max_steps = U * num_epochs``, unless ``config.max_steps > 0``: then, as in
the native trainer, it sets ``max_steps`` and the number of epochs ``ceil(max_steps / U)``, and the plan ends at
the batch that completes update ``max_steps`` (that batch also ends the last, truncated epoch).

Negative labels (v2): a batch's records carry, with probability ``config.negative_label_prob`` each, the entity
labels of the training data they do not list, as empty answers; the draw depends only on (seed, epoch, row)
(see ``augment.py``), never on a random stream's state.

Label subsets (v3): then, during epochs ``e < config.label_subset_until * num_epochs``, a record whose entity task
asks two or more labels is asked a random proper non-empty subset of them instead, with probability
``config.label_subset_prob``; again from (seed, epoch, row) only (``augment.with_label_subset``).

Validation after batch ``i``'s update: ``eval_strategy="epoch"``: every epoch end (including the plan's last
batch); ``"steps"``: every update that makes the step count a multiple of ``eval_steps`` (epoch-end flushes
included); ``"no"``: never. Like the native trainer, no extra validation is added at the end of a "steps" plan.

Random stream, row orders and length grouping are implemented in ``plan_order``; ``PlanBatch`` and
``SelectionPolicy`` live in ``plan_types``.

Fingerprint: sha256 of the canonical JSON of ``{"architecture", "config": config.fingerprint_fields(),
"plan_algorithm_version", "record_count", "records_sha256"}``, where ``records_sha256`` is the sha256 of every
record's 32-byte content digest concatenated in row order.
"""

from __future__ import annotations

import hashlib
import math
import os
from array import array
from collections.abc import Mapping
from typing import Any

from prefect_gliner2.session_core.augment import (
    entity_label_set,
    label_subset_probability,
    with_label_subset,
    with_negative_labels,
)
from prefect_gliner2.session_core.canonical import RecordSet, canonical_json
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.manifest import LoadedManifest, build_manifest, load_manifest, manifest_bytes
from prefect_gliner2.session_core.plan_order import PLAN_ALGORITHM_VERSION, group_by_length, random_keys, shuffled
from prefect_gliner2.session_core.plan_types import PlanBatch, SelectionPolicy
from prefect_gliner2.session_core.records import load_records

__all__ = [
    "ARCHITECTURES",
    "PLAN_ALGORITHM_VERSION",
    "ManagedTrainingPlan",
    "PlanBatch",
    "SelectionPolicy",
    "random_keys",
]

ARCHITECTURES = ("span", "boundary")
_ORDER_CACHE_ROWS = 1 << 25  # cache epoch orders up to ~128 MiB of row indices (at least two epochs)


class ManagedTrainingPlan:
    """The exact, deterministic batch schedule of one training run (torch-free; see the module docstring).

    A dispatcher submits ``batch(i)`` to ``forward_backward``, then ``optim_step`` iff ``is_update(i)``, and
    persists ``i + 1`` only after both commit; ``step_after(i)`` is the optimizer step count at that point.
    """

    def __init__(self, examples: Any, config: TrainingConfig | Mapping[str, Any], architecture: str = "span") -> None:
        if isinstance(config, Mapping):
            config = TrainingConfig.from_dict(config)
        if not isinstance(config, TrainingConfig):
            raise ConfigError(
                f"config must be a TrainingConfig, got {type(config).__name__}; build one with TrainingConfig(...)"
            )
        if architecture not in ARCHITECTURES:
            raise ConfigError(
                f"architecture must be one of {list(ARCHITECTURES)}, got {architecture!r}; pass model.architecture"
            )
        self._config = config
        self._architecture = architecture
        self._records = load_records(examples, what="training")
        self._grouped = config.group_by_length and architecture == "boundary"
        self._epoch_orders: dict[int, array] = {}
        self._entity_labels: tuple[str, ...] | None = None  # for negative labels, on first use
        self._layout()
        self._fingerprint = self._compute_fingerprint()

    def _layout(self) -> None:
        cfg, n = self._config, len(self._records)
        self._per_epoch = math.ceil(n / cfg.batch_size)
        self._updates_per_epoch = math.ceil(self._per_epoch / cfg.gradient_accumulation_steps)
        if cfg.max_steps > 0:
            self._max_steps = cfg.max_steps
            self._num_epochs = math.ceil(cfg.max_steps / self._updates_per_epoch)
            last_updates = cfg.max_steps - (self._num_epochs - 1) * self._updates_per_epoch
            last_batches = min(last_updates * cfg.gradient_accumulation_steps, self._per_epoch)
        else:
            assert cfg.num_epochs is not None  # the recipe's when not given (resolved when the config was built)
            self._max_steps = self._updates_per_epoch * cfg.num_epochs
            self._num_epochs = cfg.num_epochs
            last_batches = self._per_epoch
        self._batch_count = (self._num_epochs - 1) * self._per_epoch + last_batches

    def _compute_fingerprint(self) -> str:
        payload = {
            "architecture": self._architecture,
            "config": self._config.fingerprint_fields(),
            "plan_algorithm_version": PLAN_ALGORITHM_VERSION,
            "record_count": len(self._records),
            "records_sha256": self._records.digest_hex,
        }
        return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------------------ public properties

    @property
    def config(self) -> TrainingConfig:
        return self._config

    @property
    def architecture(self) -> str:
        return self._architecture

    @property
    def records(self) -> RecordSet:
        """The validated, canonical training records; ``rows`` index into them."""
        return self._records

    @property
    def batch_count(self) -> int:
        return self._batch_count

    @property
    def max_steps(self) -> int:
        """The number of optimizer updates the plan performs (pass it to ``TrainingSession(max_steps=...)``)."""
        return self._max_steps

    @property
    def num_epochs(self) -> int:
        """Epochs the plan touches (derived from ``max_steps`` when ``config.max_steps > 0``)."""
        return self._num_epochs

    @property
    def batches_per_epoch(self) -> int:
        return self._per_epoch

    @property
    def updates_per_epoch(self) -> int:
        return self._updates_per_epoch

    @property
    def length_grouped(self) -> bool:
        return self._grouped

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def selection(self) -> SelectionPolicy:
        return SelectionPolicy.from_config(self._config)

    def __len__(self) -> int:
        return self._batch_count

    def __repr__(self) -> str:
        return (
            f"ManagedTrainingPlan({len(self._records)} records, {self._batch_count} batches, "
            f"{self._max_steps} updates, {self._architecture}, fingerprint {self._fingerprint[:12]})"
        )

    # ------------------------------------------------------------------------------ per-batch queries

    def _position(self, i: int) -> tuple[int, int]:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"batch index must be an int, got {type(i).__name__}")
        if not 0 <= i < self._batch_count:
            raise IndexError(f"batch index {i} is outside this plan: valid indices are 0..{self._batch_count - 1}")
        return divmod(i, self._per_epoch)

    def epoch(self, i: int) -> int:
        """0-based epoch of batch ``i``."""
        return self._position(i)[0]

    def is_update(self, i: int) -> bool:
        """Whether ``optim_step`` follows batch ``i`` (it closes an accumulation window or ends an epoch)."""
        _, pos = self._position(i)
        return pos == self._per_epoch - 1 or (pos + 1) % self._config.gradient_accumulation_steps == 0

    def is_epoch_end(self, i: int) -> bool:
        _, pos = self._position(i)
        return pos == self._per_epoch - 1 or i == self._batch_count - 1

    def step_after(self, i: int) -> int:
        """Optimizer steps completed once batch ``i``'s operations commit."""
        epoch, pos = self._position(i)
        accum = self._config.gradient_accumulation_steps
        flushed = 1 if pos == self._per_epoch - 1 and self._per_epoch % accum else 0
        return epoch * self._updates_per_epoch + (pos + 1) // accum + flushed

    def is_validation(self, i: int) -> bool:
        """Whether validation runs after batch ``i``'s update."""
        strategy = self._config.eval_strategy
        if strategy == "epoch":
            return self.is_epoch_end(i)
        if strategy == "steps":
            return self.is_update(i) and self.step_after(i) % self._config.eval_steps == 0
        self._position(i)
        return False

    def window_size(self, i: int) -> int:
        """Micro-batches in batch ``i``'s accumulation window (smaller only for an epoch's flushed last window)."""
        _, pos = self._position(i)
        accum = self._config.gradient_accumulation_steps
        return min(accum, self._per_epoch - (pos // accum) * accum)

    def rows(self, i: int) -> tuple[int, ...]:
        """Row indices (into ``records``) of batch ``i``."""
        epoch, pos = self._position(i)
        size = self._config.batch_size
        return tuple(self._order(epoch)[pos * size : (pos + 1) * size])

    def batch(self, i: int) -> PlanBatch:
        rows = self.rows(i)
        return PlanBatch(
            index=i,
            epoch=self.epoch(i),
            rows=rows,
            examples=tuple(self._augmented(rows, self.epoch(i))),
            is_update=self.is_update(i),
            is_epoch_end=self.is_epoch_end(i),
            is_validation=self.is_validation(i),
            window_size=self.window_size(i),
        )

    def _augmented(self, rows: tuple[int, ...], epoch: int) -> list[dict[str, Any]]:
        """The rows' canonical records with negative labels added (``negative_label_prob``), then some asked a subset
        of their labels (``label_subset_prob``); see augment.py."""
        cfg = self._config
        examples = self._records.examples(rows)
        seed = int(cfg.seed)
        negatives = float(cfg.negative_label_prob)
        if negatives > 0.0:
            if self._entity_labels is None:
                self._entity_labels = entity_label_set(self._records.examples())
            examples = [
                with_negative_labels(example, self._entity_labels, negatives, seed=seed, epoch=epoch, row=row)
                for example, row in zip(examples, rows, strict=True)
            ]
        subsets = label_subset_probability(cfg.label_subset_prob, cfg.label_subset_until, epoch, self._num_epochs)
        if subsets > 0.0:
            examples = [
                with_label_subset(example, subsets, seed=seed, epoch=epoch, row=row)
                for example, row in zip(examples, rows, strict=True)
            ]
        return examples

    def updates(self) -> list[int]:
        """Indices of every batch followed by an optimizer step, in order (``len == max_steps``)."""
        per, accum = self._per_epoch, self._config.gradient_accumulation_steps
        in_epoch = list(range(accum - 1, per, accum)) + ([per - 1] if per % accum else [])
        return [i for e in range(self._num_epochs) for i in (e * per + k for k in in_epoch) if i < self._batch_count]

    def epoch_ends(self) -> list[int]:
        ends = [e * self._per_epoch + self._per_epoch - 1 for e in range(self._num_epochs - 1)]
        return ends + [self._batch_count - 1]

    def validations(self) -> list[int]:
        """Indices of the batches after whose update validation runs."""
        strategy, every = self._config.eval_strategy, self._config.eval_steps
        if strategy == "epoch":
            return self.epoch_ends()
        if strategy == "steps":
            return [i for step, i in enumerate(self.updates(), 1) if step % every == 0]
        return []

    # ------------------------------------------------------------------------------ row orders

    def epoch_order(self, epoch: int) -> array:
        """A copy of epoch ``epoch``'s full row order (batches are consecutive ``batch_size`` slices)."""
        return array("I", self._order(epoch))

    def _order(self, epoch: int) -> array:
        if not 0 <= epoch < self._num_epochs:
            raise IndexError(f"epoch {epoch} is outside this plan: valid epochs are 0..{self._num_epochs - 1}")
        order = self._epoch_orders.get(epoch)
        if order is None:
            order = self._compute_order(epoch)
            if len(self._epoch_orders) >= max(2, _ORDER_CACHE_ROWS // max(1, len(order))):
                self._epoch_orders.pop(next(iter(self._epoch_orders)))
            self._epoch_orders[epoch] = order
        return order

    def _compute_order(self, epoch: int) -> array:
        n = len(self._records)
        order = shuffled(n, self._config.seed, epoch, "rows")
        if self._grouped:
            cfg = self._config
            lengths = self._records.lengths
            order = group_by_length(order, lengths, cfg.batch_size, cfg.length_group_window_batches, cfg.seed, epoch)
        return array("I", order)

    # ------------------------------------------------------------------------------ manifests

    def to_manifest(self, eval_examples: Any = None) -> dict[str, Any]:
        """The content-addressed JSON manifest (see ``prefect_gliner2.session_core.manifest``); it contains the training
        data."""
        return build_manifest(self, eval_examples)

    def manifest_bytes(self, eval_examples: Any = None) -> bytes:
        """``to_manifest(...)`` serialized exactly as ``write_manifest`` stores it, without building record dicts."""
        return manifest_bytes(self, eval_examples)

    @classmethod
    def from_manifest(
        cls, manifest_or_uri: Mapping[str, Any] | str | os.PathLike[str]
    ) -> LoadedManifest[ManagedTrainingPlan]:
        """Verify a manifest (dict or URI) and rebuild its plan; returns ``LoadedManifest`` (unpacks to plan,
        eval_records)."""
        return load_manifest(
            manifest_or_uri, lambda examples, config, architecture: cls(examples, config, architecture)
        )
