"""Every file and directory name this package writes or reads: run directories, checkpoints, exports, the registry.

No I/O and no imports beyond the standard library: this module only names things. ::

    <storage>/<run_key>/                     a run directory
        manifest.json                        MANIFEST_FILE      the plan, content-addressed; written once
        run.json                             RUN_INFO_FILE      settings that must not change on resume
        cursor.json                          CURSOR_FILE        the durable cursor (names the newest checkpoint)
        .lease                               LEASE_FILE         the run-key lease (flock, local storage)
        .lease.d/<owner>.json                LEASE_CLAIMS_DIR   lease claims (object storage)
        checkpoints/                         CHECKPOINTS_DIR
            step-000012-batch-000047/        checkpoint_name(step, index)
                checkpoint.json              CHECKPOINT_INDEX_FILE   the hash index, written last (the commit)
                session.json weights.safetensors gradients.safetensors rng.safetensors    the session's state
                optimizer.safetensors optimizer.pt scheduler.pt scaler.pt [trainer_extra.pt]
                managed.json                                             the managed driver's state
            blobs/blake3-<hex>.safetensors   BLOB_DIR: content-addressed files checkpoints refer to (best weights;
                                             older formats named them sha256-<hex> / chunked-sha256-<hex>)
            .damaged-step-000012-batch-000047-<time>/   damaged_name(...): quarantined, kept for inspection
        export/                              EXPORT_DIR         the exported model (unless elsewhere)
            export.json                      EXPORT_MARKER_FILE written last (the commit)
            .pending.json                    PENDING_FILE       object storage: a commit in progress (or killed)
            config.json model.safetensors    MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE (a native gliner2 model)
            adapter/ merged/                 ADAPTER_DIR, MERGED_DIR (LoRA runs; PEFT's adapter_config.json and
                                             adapter_model.safetensors: ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)
            onnx/                            ONNX_DIR: an ONNX export of it (optional), onnx_export.json written last
                                             (ONNX_EXPORT_FILE); gliner2_config.json and fp32/ int8/ fp16/ graphs

    <registry root>/<name>/
        versions/v000001/                    REGISTRY_VERSIONS_DIR; a model directory + lineage.json (written last)
        CURRENT.json                         REGISTRY_POINTER_FILE

Staging names: a local write stages into a hidden sibling (``staging_name``: ``.<name>.partial-<pid>-<random>``
for directories, ``.<name>.<random>.tmp`` for single files) and renames it into place; ``is_debris`` recognises
what a killed writer leaves behind.
"""

from __future__ import annotations

import os
import re
import secrets

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_DIR",
    "ADAPTER_WEIGHTS_FILE",
    "BEST_WEIGHTS_FILE",
    "BLOB_DIR",
    "CHECKPOINTS_DIR",
    "CHECKPOINT_INDEX_FILE",
    "CURSOR_FILE",
    "DAMAGED_PREFIX",
    "EXPORT_DIR",
    "EXPORT_MARKER_FILE",
    "GRADIENTS_FILE",
    "LEASE_CLAIMS_DIR",
    "LEASE_FILE",
    "MANAGED_STATE_FILE",
    "MANIFEST_FILE",
    "MERGED_DIR",
    "MODEL_CONFIG_FILE",
    "MODEL_WEIGHTS_FILE",
    "MODEL_WEIGHTS_INDEX_FILE",
    "ONNX_DIR",
    "ONNX_EXPORT_FILE",
    "OPTIMIZER_FILE",
    "OPTIMIZER_TENSORS_FILE",
    "REGISTRY_LINEAGE_FILE",
    "REGISTRY_POINTER_FILE",
    "REGISTRY_VERSIONS_DIR",
    "RNG_FILE",
    "RUN_INFO_FILE",
    "SCALER_FILE",
    "SCHEDULER_FILE",
    "SESSION_STATE_FILE",
    "STAGING_MARKER",
    "PENDING_FILE",
    "TEMP_SUFFIX",
    "TRAINER_EXTRA_FILE",
    "WEIGHTS_FILE",
    "checkpoint_name",
    "damaged_name",
    "is_debris",
    "parse_checkpoint_name",
    "staging_name",
    "temp_prefix",
]

# ---- run directory -----------------------------------------------------------------------------------------
MANIFEST_FILE = "manifest.json"
RUN_INFO_FILE = "run.json"
CURSOR_FILE = "cursor.json"
LEASE_FILE = ".lease"
LEASE_CLAIMS_DIR = ".lease.d"  # object storage: one claim object per contender (runtime/lease.py)
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "export"

# ---- checkpoint directory ----------------------------------------------------------------------------------
CHECKPOINT_INDEX_FILE = "checkpoint.json"
SESSION_STATE_FILE = "session.json"
WEIGHTS_FILE = "weights.safetensors"
GRADIENTS_FILE = "gradients.safetensors"
RNG_FILE = "rng.safetensors"
OPTIMIZER_TENSORS_FILE = "optimizer.safetensors"  # the optimizer's tensors, streamed
OPTIMIZER_FILE = "optimizer.pt"  # the optimizer state's structure (no tensors)
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
TRAINER_EXTRA_FILE = "trainer_extra.pt"  # only when the trainer has session_state_dict hooks
MANAGED_STATE_FILE = "managed.json"
BEST_WEIGHTS_FILE = "best.safetensors"  # a ref into BLOB_DIR, only when validation selected a best model
BLOB_DIR = "blobs"  # beside the checkpoints: content-addressed files referred to by checkpoint indexes

# ---- export directory (a native gliner2 model directory plus our marker) -------------------------------------
EXPORT_MARKER_FILE = "export.json"
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
MODEL_CONFIG_FILE = "config.json"
MODEL_WEIGHTS_FILE = "model.safetensors"
MODEL_WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"

# ---- ONNX export (the gliner2-onnx runtime's directory plus our marker; training/onnx_export.py) ---------------
ONNX_EXPORT_FILE = "onnx_export.json"  # written last (the commit): provenance, thresholds, schema, parity figures
ONNX_DIR = "onnx"  # an ONNX export inside a model export (a training flow's optional step; kept by the registry)

# ---- model registry ------------------------------------------------------------------------------------------
REGISTRY_VERSIONS_DIR = "versions"
REGISTRY_LINEAGE_FILE = "lineage.json"
REGISTRY_POINTER_FILE = "CURRENT.json"

# ---- staging and quarantine --------------------------------------------------------------------------------
STAGING_MARKER = ".partial-"
TEMP_SUFFIX = ".tmp"
PENDING_FILE = ".pending.json"  # object storage: written first by a directory commit, removed after its marker
DAMAGED_PREFIX = ".damaged-"

_CHECKPOINT_NAME = re.compile(r"^step-(\d{6})-batch-(\d{6})$")


def checkpoint_name(step: int, index: int) -> str:
    """Readable checkpoint directory name: the optimizer step and the last batch included."""
    return f"step-{step:06d}-batch-{index:06d}"


def parse_checkpoint_name(name: str) -> tuple[int, int] | None:
    """(step, index) of a checkpoint directory name, None for any other name."""
    match = _CHECKPOINT_NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def damaged_name(name: str, when: int) -> str:
    """Where a damaged checkpoint `name` is moved aside (debris cleaning leaves it alone)."""
    return f"{DAMAGED_PREFIX}{name}-{when}"


def staging_name(name: str) -> str:
    """A fresh hidden sibling name under which directory `name` is staged before its rename into place."""
    return f".{name}{STAGING_MARKER}{os.getpid()}-{secrets.token_hex(4)}"


def temp_prefix(name: str) -> str:
    """The prefix of the hidden temporary sibling a single-file atomic write of `name` uses (suffix TEMP_SUFFIX)."""
    return f".{name}."


def is_debris(entry: str, of: str | None = None) -> bool:
    """Whether directory entry `entry` is a staging leftover (of target `of` only, when given)."""
    if not entry.startswith("."):
        return False
    if of is not None:
        return entry.startswith(f".{of}{STAGING_MARKER}") or (
            entry.startswith(temp_prefix(of)) and entry.endswith(TEMP_SUFFIX)
        )
    return STAGING_MARKER in entry or entry.endswith(TEMP_SUFFIX)
