"""Plan manifests: the content-addressed JSON form of a ManagedTrainingPlan, and writing/reading/verifying it.

A manifest is one JSON object (schema ``MANIFEST_SCHEMA_NAME``, version ``MANIFEST_SCHEMA_VERSION``)::

    schema                  {"name": ..., "version": 1}
    plan_algorithm_version  the plan algorithm that produced the batches (see prefect_gliner2.session_core.plan)
    architecture            "span" or "boundary"
    config                  the full TrainingConfig.to_dict() (fingerprint fields and the rest)
    fingerprint             the plan fingerprint (sha256 hex)
    record_count            number of training records
    num_epochs, batch_count, max_steps
    batches                 exact row indices (into "examples") of every batch, in execution order
    updates                 indices of the batches followed by an optimizer step
    epoch_ends              indices of the batches that end an epoch
    validations             indices of the batches after whose update validation runs
    selection               the selection policy (metric_for_best, greater_is_better, save_best, early_stopping,
                            early_stopping_patience, early_stopping_threshold, eval_strategy, eval_steps)
    examples                the training records {"input", "output"}, in row order
    eval_examples           the validation records (may be empty)
    content_address         sha256 of the canonical JSON of all other keys: top-level keys sorted, no whitespace,
                            UTF-8; nested keys sorted too, except inside the records (examples, eval_examples),
                            whose key order is data (gliner2 builds the schema in dict order) and is kept

Files hold exactly that canonical JSON plus a newline. A manifest must never be edited: loading recomputes the
content address, rebuilds the plan from examples + config + architecture and requires identical batches,
boundaries and fingerprint; to change anything, regenerate the manifest from the data.

A manifest CONTAINS THE TRAINING (AND VALIDATION) DATA: store it with the same authorization and retention as
the source dataset. Local files are written owner-only (0o600).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import fsspec

from prefect_gliner2.session_core.canonical import RecordSet, canonical_json, paused_gc, record_json
from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError, ManifestError, PlanMismatchError, RecordError
from prefect_gliner2.session_core.plan_order import PLAN_ALGORITHM_VERSION
from prefect_gliner2.session_core.plan_types import SelectionPolicy
from prefect_gliner2.session_core.records import load_records
from prefect_gliner2.session_core.storage import resolve, write_atomic

__all__ = [
    "MANIFEST_SCHEMA_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "EncodedManifest",
    "LoadedManifest",
    "PlannedRun",
    "build_manifest",
    "content_address",
    "dumps_manifest",
    "encode_manifest",
    "load_manifest",
    "manifest_bytes",
    "read_manifest",
    "write_manifest",
]

MANIFEST_SCHEMA_NAME = "prefect-gliner2/training-plan-manifest"
MANIFEST_SCHEMA_VERSION = 2  # 2: record key order is kept (v1 sorted it)
_REQUIRED = (
    "schema",
    "plan_algorithm_version",
    "architecture",
    "config",
    "fingerprint",
    "record_count",
    "num_epochs",
    "batch_count",
    "max_steps",
    "batches",
    "updates",
    "epoch_ends",
    "validations",
    "selection",
    "examples",
    "eval_examples",
    "content_address",
)
_RECORD_PARTS = frozenset({"examples", "eval_examples"})


def _part_json(key: str, value: Any) -> str:
    """The canonical JSON of one top-level manifest value (records keep their key order)."""
    return record_json(value) if key in _RECORD_PARTS else canonical_json(value)


def _given_parts(manifest: Mapping[str, Any]) -> dict[str, str]:
    return {k: _part_json(k, v) for k, v in manifest.items() if k != "content_address"}


class PlannedRun(Protocol):
    """What a manifest records of a plan (``ManagedTrainingPlan`` is one; the plan module imports this one, never
    the reverse)."""

    @property
    def architecture(self) -> str: ...
    @property
    def config(self) -> TrainingConfig: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def records(self) -> RecordSet: ...
    @property
    def num_epochs(self) -> int: ...
    @property
    def batch_count(self) -> int: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def batches_per_epoch(self) -> int: ...
    @property
    def selection(self) -> SelectionPolicy: ...
    def updates(self) -> list[int]: ...
    def epoch_ends(self) -> list[int]: ...
    def validations(self) -> list[int]: ...
    def epoch_order(self, epoch: int) -> array: ...


P = TypeVar("P", bound=PlannedRun)
#: Builds the plan a manifest describes from its records, config and architecture (``ManagedTrainingPlan``).
Rebuild = Callable[[Any, TrainingConfig, str], P]


@dataclass(frozen=True)
class LoadedManifest(Generic[P]):
    """A verified manifest: its rebuilt plan and validation records (unpacks as ``plan, eval_records``)."""

    plan: P
    eval_records: RecordSet
    content_address: str

    @property
    def eval_examples(self) -> list[dict[str, Any]]:
        return self.eval_records.examples()

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.eval_records))


# ------------------------------------------------------------------------------------------- building


def _manifest_parts(plan: PlannedRun, eval_records: RecordSet) -> dict[str, str]:
    """Top-level key -> canonical JSON text of its value, for every key but ``content_address``."""
    values: dict[str, Any] = {
        "schema": {"name": MANIFEST_SCHEMA_NAME, "version": MANIFEST_SCHEMA_VERSION},
        "plan_algorithm_version": PLAN_ALGORITHM_VERSION,
        "architecture": plan.architecture,
        "config": plan.config.to_dict(),
        "fingerprint": plan.fingerprint,
        "record_count": len(plan.records),
        "num_epochs": plan.num_epochs,
        "batch_count": plan.batch_count,
        "max_steps": plan.max_steps,
        "updates": plan.updates(),
        "epoch_ends": plan.epoch_ends(),
        "validations": plan.validations(),
        "selection": plan.selection.to_dict(),
    }
    parts = {key: canonical_json(value) for key, value in values.items()}
    parts["batches"] = _batches_json(plan)
    parts["examples"] = plan.records.json_array()
    parts["eval_examples"] = eval_records.json_array()
    return parts


def _batches_json(plan: PlannedRun) -> str:
    size, per_epoch = plan.config.batch_size, plan.batches_per_epoch
    pieces = []
    for epoch in range(plan.num_epochs):
        order = plan.epoch_order(epoch).tolist()
        count = min(per_epoch, plan.batch_count - epoch * per_epoch)
        pieces.append(canonical_json([order[k * size : (k + 1) * size] for k in range(count)])[1:-1])
    return "[" + ",".join(p for p in pieces if p) + "]"


def _join(parts: Mapping[str, str]) -> str:
    return "{" + ",".join(f"{canonical_json(key)}:{parts[key]}" for key in sorted(parts)) + "}"


def _address(parts: Mapping[str, str]) -> str:
    return hashlib.sha256(_join(parts).encode("utf-8")).hexdigest()


def _eval_records(eval_examples: Any) -> RecordSet:
    return load_records(eval_examples if eval_examples is not None else [], what="validation", allow_empty=True)


def build_manifest(plan: PlannedRun, eval_examples: Any = None) -> dict[str, Any]:
    """``plan.to_manifest(eval_examples)``: the manifest as a dict (see the module docstring)."""
    parts = _manifest_parts(plan, _eval_records(eval_examples))
    address = _address(parts)
    with paused_gc():
        manifest = {key: json.loads(text) for key, text in parts.items()}
    manifest["content_address"] = address
    return manifest


@dataclass(frozen=True)
class EncodedManifest:
    """A manifest's file bytes with what callers need from it, so nobody parses the bytes back to find out."""

    data: bytes
    content_address: str
    eval_record_count: int


def encode_manifest(plan: PlannedRun, eval_examples: Any = None) -> EncodedManifest:
    """The file bytes of ``build_manifest(plan, eval_examples)`` (built from the canonical record strings), with
    their content address and the number of validation records."""
    eval_records = _eval_records(eval_examples)
    parts = _manifest_parts(plan, eval_records)
    address = _address(parts)
    parts["content_address"] = canonical_json(address)
    return EncodedManifest((_join(parts) + "\n").encode("utf-8"), address, len(eval_records))


def manifest_bytes(plan: PlannedRun, eval_examples: Any = None) -> bytes:
    """The file bytes of ``build_manifest(plan, eval_examples)``, built from the canonical record strings."""
    return encode_manifest(plan, eval_examples).data


def content_address(manifest: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of every key except ``content_address``."""
    return _address(_given_parts(manifest))


def dumps_manifest(manifest: Mapping[str, Any]) -> bytes:
    """A manifest's file bytes: its canonical JSON and a newline."""
    parts = _given_parts(manifest)
    if "content_address" in manifest:
        parts["content_address"] = canonical_json(manifest["content_address"])
    return (_join(parts) + "\n").encode("utf-8")


# ------------------------------------------------------------------------------------------ storage


def write_manifest(manifest: Mapping[str, Any] | bytes, uri: str | os.PathLike[str]) -> str:
    """Atomically write a manifest (dict, or bytes from ``manifest_bytes``) to a path or fsspec URL.

    A dict whose content address does not match is refused. The write is ``storage.write_atomic``: local files are
    created owner-only (0o600) under a temporary name, fsynced, then renamed; elsewhere one object write.
    """
    if isinstance(manifest, (bytes, bytearray)):
        data = bytes(manifest)
    else:
        if not isinstance(manifest, Mapping) or "content_address" not in manifest:
            raise ManifestError("write_manifest needs a manifest from plan.to_manifest() (it has no content_address)")
        parts = _given_parts(manifest)
        if _address(parts) != manifest["content_address"]:
            raise ManifestError(
                "refusing to write a manifest whose content address does not match its content: manifests must not "
                "be edited; regenerate it from the data with plan.to_manifest()"
            )
        parts["content_address"] = canonical_json(manifest["content_address"])
        data = (_join(parts) + "\n").encode("utf-8")
    target = os.fspath(uri)
    fs, path = resolve(target)
    write_atomic(fs, path, data)
    return target


def read_manifest(uri: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a manifest file (path or fsspec URL) into a dict; not verified (``load_manifest`` verifies)."""
    target = os.fspath(uri)
    with fsspec.open(target, "rb") as handle:
        data = handle.read()
    try:
        with paused_gc():
            manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ManifestError(
            f"manifest {target!r} is not valid UTF-8 JSON ({exc}); it is truncated or corrupted"
        ) from exc
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest {target!r} must hold a JSON object, got {type(manifest).__name__}")
    return manifest


# ------------------------------------------------------------------------------------------ loading


def load_manifest(
    manifest_or_uri: Mapping[str, Any] | str | os.PathLike[str], rebuild: Rebuild[P]
) -> LoadedManifest[P]:
    """Verify a manifest and rebuild its plan with `rebuild` (``ManagedTrainingPlan.from_manifest`` passes itself).

    Raises ``ManifestError`` for an unknown schema, a content address that does not match (the manifest was
    edited) or invalid content, and ``PlanMismatchError`` when the rebuilt plan differs from the recorded one.
    """
    if isinstance(manifest_or_uri, Mapping):
        manifest = manifest_or_uri
    elif isinstance(manifest_or_uri, (str, os.PathLike)):
        manifest = read_manifest(manifest_or_uri)
    else:
        raise ManifestError(f"from_manifest needs a manifest dict or a path/URL, got {type(manifest_or_uri).__name__}")
    _check_schema(manifest)
    given = _given_parts(manifest)
    if _address(given) != manifest["content_address"]:
        raise ManifestError(
            "manifest content address does not match its content "
            f"(recorded {str(manifest['content_address'])[:12]}..., "
            f"computed {_address(given)[:12]}...): it was edited or corrupted after it was written. Manifests must not "
            "be edited; regenerate it from the data with ManagedTrainingPlan(...).to_manifest()"
        )
    if manifest["plan_algorithm_version"] != PLAN_ALGORITHM_VERSION:
        raise ManifestError(
            f"manifest was planned with plan algorithm v{manifest['plan_algorithm_version']}, but this version of "
            f"prefect-gliner2 implements v{PLAN_ALGORITHM_VERSION}; use a matching prefect-gliner2 or re-plan"
        )
    try:
        config = TrainingConfig.from_dict(manifest["config"])
        plan = rebuild(manifest["examples"], config, manifest["architecture"])
        eval_records = load_records(manifest["eval_examples"], what="validation", allow_empty=True)
    except (ConfigError, RecordError) as exc:
        raise ManifestError(f"manifest content is invalid: {exc}") from exc
    _check_rebuilt(given, _manifest_parts(plan, eval_records), plan)
    return LoadedManifest(plan=plan, eval_records=eval_records, content_address=str(manifest["content_address"]))


def _check_schema(manifest: Mapping[str, Any]) -> None:
    schema = manifest.get("schema")
    if not isinstance(schema, Mapping) or schema.get("name") != MANIFEST_SCHEMA_NAME:
        raise ManifestError(
            f"not a training-plan manifest: 'schema' must be {{'name': {MANIFEST_SCHEMA_NAME!r}, 'version': N}}"
        )
    version = schema.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ManifestError(f"manifest schema version {version!r} is not a known version; regenerate the manifest")
    if version > MANIFEST_SCHEMA_VERSION:
        raise ManifestError(
            f"manifest schema version {version} is newer than this prefect-gliner2 supports "
            f"(up to {MANIFEST_SCHEMA_VERSION}); upgrade prefect-gliner2 to read it"
        )
    if version < MANIFEST_SCHEMA_VERSION:
        raise ManifestError(
            f"manifest schema version {version} is no longer supported: version 1 sorted the keys inside each record, "
            "which reorders the schema gliner2 trains on; regenerate the manifest from the data with "
            "ManagedTrainingPlan(...).to_manifest() (new runs need a new run key)"
        )
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise ManifestError(f"manifest is missing {missing}; regenerate it with plan.to_manifest()")
    unknown = sorted(set(manifest) - set(_REQUIRED))
    if unknown:
        raise ManifestError(f"manifest has unknown keys {unknown}; manifests must not be edited, regenerate it")


def _check_rebuilt(given: Mapping[str, str], rebuilt: Mapping[str, str], plan: PlannedRun) -> None:
    if given["fingerprint"] != rebuilt["fingerprint"]:
        raise PlanMismatchError(
            f"manifest fingerprint {given['fingerprint'][:14]}... "
            f"!= rebuilt plan fingerprint {plan.fingerprint[:12]}...: "
            "the manifest was not produced by this plan algorithm from its own data; regenerate it from the data"
        )
    differing = [key for key in sorted(rebuilt) if given.get(key) != rebuilt[key]]
    if differing:
        raise PlanMismatchError(
            f"manifest {differing} differ from the plan rebuilt from its examples, config and architecture; "
            "regenerate the manifest with this prefect-gliner2 version"
        )
