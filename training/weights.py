"""Weights in and out of a session: load_weights (validated copy into live parameters) and export_weights.

load_weights accepts a native gliner2 model directory (single `model.safetensors` or sharded
`model.safetensors.index.json`), a PEFT adapter directory (`adapter_config.json`), or a complete session
checkpoint (weights only). Every tensor is checked (names, shapes, dtype, finiteness) before the first copy, so a
rejected load leaves the session untouched. Only lossless dtype conversions (to a wider float) are allowed.

export_weights writes a native model directory that `gliner2.AutoExtractor.from_pretrained` loads. For a LoRA
session that directory holds the frozen base model, `adapter/` holds the PEFT adapter (base + adapter predicts
exactly like the live model; see `load_exported_model`), and `merged/` (on request) a merged full model. Exports are
built from detached copies; live weights, optimizer state and RNG streams are never touched.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import fsspec
import safetensors.torch
import torch

from prefect_gliner2.session_core.checkpoint import open_checkpoint
from prefect_gliner2.session_core.errors import AdapterMismatchError, WeightsError
from prefect_gliner2.session_core.layout import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS_FILE,
    CHECKPOINT_INDEX_FILE,
    EXPORT_MARKER_FILE,
    MERGED_DIR,
    MODEL_CONFIG_FILE,
    MODEL_WEIGHTS_FILE,
    MODEL_WEIGHTS_INDEX_FILE,
    WEIGHTS_FILE,
)
from prefect_gliner2.session_core.storage import directory_commit, interrupted_commit, is_local, resolve
from prefect_gliner2.session_core.tempcopies import TEMP_PREFIX, clean_stale_temp
from prefect_gliner2.session_core.thresholds import THRESHOLDS_KEY
from prefect_gliner2.training.engine import SessionEngine, unwrap, validate_adapter_config
from prefect_gliner2.training.native_save import SameBytes, weights_written_direct
from prefect_gliner2.training.state import (
    base_weights,
    canonical_name,
    file_tensors_digest,
    read_tensors,
    same_base_weights,
    tensors_digest,
    weights_digest,
)


class SessionWeights(Protocol):
    """What loading and exporting weights use of a session (``TrainingSession`` is one; it imports this module,
    never the reverse)."""

    provenance: dict[str, Any]

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def engine(self) -> SessionEngine: ...
    @property
    def step(self) -> int: ...
    @property
    def architecture(self) -> str: ...
    @property
    def is_lora(self) -> bool: ...


_WIDENING = {
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float64),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.float64),
}


# ---- load ----------------------------------------------------------------------------------------------------


def load_weights(session: SessionWeights, uri: str) -> dict[str, Any]:
    """Validate and copy weights from `uri` into the session's parameters; returns a provenance report."""
    fs, path = fsspec.core.url_to_fs(uri)
    path = path.rstrip("/")
    if not fs.isdir(path):
        raise WeightsError(f"load_weights: {uri} is not a directory; pass a model, adapter or checkpoint directory")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}
    if CHECKPOINT_INDEX_FILE in names:
        return _load_from_checkpoint(session, uri)
    if ADAPTER_CONFIG_FILE in names:
        return _load_adapter(session, fs, path, uri)
    if MODEL_CONFIG_FILE in names and ({MODEL_WEIGHTS_FILE, MODEL_WEIGHTS_INDEX_FILE} & names):
        return _load_native(session, fs, path, uri)
    raise WeightsError(
        f"load_weights: {uri} holds none of checkpoint.json (session checkpoint), adapter_config.json (PEFT "
        "adapter) or config.json + model.safetensors[.index.json] (native model); found "
        f"{sorted(names)[:10]}. Pickled *.bin weights are not accepted"
    )


def _load_native(session: SessionWeights, fs: Any, path: str, uri: str) -> dict[str, Any]:
    config = json.loads(fs.cat_file(f"{path}/{MODEL_CONFIG_FILE}"))
    architecture = config.get("architecture", "span")
    if architecture != session.architecture:
        raise WeightsError(f"{uri} is a {architecture!r} model; this session trains a {session.architecture!r} model")
    tensors = _read_native_tensors(fs, path, uri)
    _copy_base(session, tensors, uri)
    return {"kind": "native", "uri": uri, "weights_sha256": tensors_digest(tensors.items())}


def _read_native_tensors(fs: Any, path: str, uri: str) -> dict[str, torch.Tensor]:
    index_path = f"{path}/{MODEL_WEIGHTS_INDEX_FILE}"
    if not fs.exists(index_path):
        return _safetensors(fs, f"{path}/{MODEL_WEIGHTS_FILE}", uri)
    index = json.loads(fs.cat_file(index_path))
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{index_path} has no weight_map; the sharded model index is damaged")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if "/" in shard or shard.startswith("."):
            raise WeightsError(f"{index_path} names an invalid shard {shard!r}")
        loaded = _safetensors(fs, f"{path}/{shard}", uri)
        for name, tensor in loaded.items():
            if weight_map.get(name) != shard:
                raise WeightsError(f"shard {shard} holds {name}, which the index maps to {weight_map.get(name)!r}")
            tensors[name] = tensor
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise WeightsError(f"sharded model {uri} is missing tensors listed in its index: {missing[:5]}")
    return tensors


def _safetensors(fs: Any, file_path: str, uri: str) -> dict[str, torch.Tensor]:
    if not fs.exists(file_path):
        raise WeightsError(f"{uri}: {file_path.rsplit('/', 1)[-1]} is missing")
    try:
        return safetensors.torch.load(fs.cat_file(file_path))
    except Exception as exc:
        raise WeightsError(f"{file_path} is not a valid safetensors file ({exc})") from exc


def _load_adapter(session: SessionWeights, fs: Any, path: str, uri: str) -> dict[str, Any]:
    from peft.utils import get_peft_model_state_dict

    if not session.is_lora:
        raise WeightsError(f"{uri} is a PEFT adapter but this session trains full weights; set use_lora=True")
    adapter_config = json.loads(fs.cat_file(f"{path}/{ADAPTER_CONFIG_FILE}"))
    validate_adapter_config(session.model, session.engine.config, adapter_config, source=uri)
    tensors = _safetensors(fs, f"{path}/{ADAPTER_WEIGHTS_FILE}", uri)
    live = get_peft_model_state_dict(session.model, adapter_name="default")
    _check_and_copy(live, tensors, uri)
    return {
        "kind": "adapter",
        "uri": uri,
        "adapter_sha256": tensors_digest(tensors.items()),
        "declared_base_model": adapter_config.get("base_model_name_or_path"),
        "base_model_hash": session.provenance["base_model_hash"],
        "note": "PEFT adapters do not record their base weights; verify the base model's provenance yourself",
    }


def _load_from_checkpoint(session: SessionWeights, uri: str) -> dict[str, Any]:
    checkpoint = open_checkpoint(uri, min_version=1)  # the weights file has the same layout in every version
    meta = checkpoint.meta
    saved_lora = bool(meta.get("config", {}).get("use_lora"))
    with checkpoint.open(WEIGHTS_FILE) as reader:  # verified before anything is copied
        tensors = read_tensors(reader)
    architecture = meta.get("compat", {}).get("model", {}).get("architecture")
    if architecture != session.architecture:
        raise WeightsError(
            f"{uri} holds a {architecture!r} model; this session trains a {session.architecture!r} model"
        )
    if saved_lora and not session.is_lora:
        raise WeightsError(
            f"{uri} holds only a LoRA adapter; export it with merged=True and load the merged model for full training"
        )
    if saved_lora:
        saved_base = meta.get("compat", {}).get("base_model_hash")
        if not same_base_weights(saved_base, session.provenance["base_model_hash"], session.model):
            raise AdapterMismatchError(
                f"the adapter in {uri} was trained on base weights {str(saved_base)[:20]}, this session's base is "
                f"{session.provenance['base_model_hash'][:20]}; load the same base model first"
            )
        live = {n: p for n, p in session.model.named_parameters() if p.requires_grad}
        _check_and_copy(live, tensors, uri)
    else:
        _copy_base(session, {canonical_name(n): t for n, t in tensors.items()}, uri)
    return {
        "kind": "checkpoint",
        "uri": uri,
        "step": meta.get("step"),
        "weights_sha256": tensors_digest(tensors.items()),
    }


def _copy_base(session: SessionWeights, tensors: Mapping[str, torch.Tensor], uri: str) -> None:
    """Copy full/base weights: all of them for full training, the frozen base under a LoRA adapter."""
    live = {canonical_name(n): t for n, t in session.model.state_dict().items() if "lora_" not in n}
    _check_and_copy(live, tensors, uri)
    if session.is_lora:
        session.provenance["base_model_hash"] = weights_digest(base_weights(session.model))


def _check_and_copy(live: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor], uri: str) -> None:
    missing, unexpected = sorted(set(live) - set(tensors)), sorted(set(tensors) - set(live))
    problems = [f"missing {len(missing)} tensor(s) e.g. {missing[:3]}"] if missing else []
    problems += [f"{len(unexpected)} unexpected tensor(s) e.g. {unexpected[:3]}"] if unexpected else []
    for name in sorted(set(live) & set(tensors)):
        have, want = tensors[name], live[name]
        if have.shape != want.shape:
            problems.append(f"{name}: shape {tuple(have.shape)} != model {tuple(want.shape)}")
        elif have.dtype != want.dtype and (have.dtype, want.dtype) not in _WIDENING:
            problems.append(f"{name}: dtype {have.dtype} cannot be loaded losslessly into {want.dtype}")
        elif have.is_floating_point() and not bool(torch.isfinite(have).all()):
            problems.append(f"{name}: contains non-finite values")
    if problems:
        raise WeightsError(
            f"load_weights refused {uri} (nothing was copied): "
            + "; ".join(problems[:6])
            + (f" (and {len(problems) - 6} more)" if len(problems) > 6 else "")
            + ". Pass weights saved from the same model architecture and size"
        )
    with torch.no_grad():
        for name, target in live.items():
            target.copy_(tensors[name].to(device=target.device, dtype=target.dtype))


# ---- export --------------------------------------------------------------------------------------------------


def export_weights(
    session: SessionWeights,
    uri: str,
    *,
    merged: bool = False,
    state: Mapping[str, torch.Tensor] | None = None,
    label: str = "final",
    step: int | None = None,
    thresholds: Mapping[str, Any] | None = None,
    schema: Mapping[str, Any] | None = None,
    before_commit: Callable[[], None] | None = None,
    same_bytes: SameBytes | None = None,
) -> dict[str, Any]:
    """Export the live model (or `state`, a detached weights dict of the same kind a checkpoint holds, taken at
    `step`: export.json names the step the exported weights come from). `thresholds` (``Thresholds.to_dict()``)
    are recorded in export.json under ``thresholds``, `schema` (what the model was trained to extract, a gliner2
    schema dict) under ``schema``.

    `before_commit` runs when every file is written, just before the export is committed (renamed into place on
    local storage; export.json written last elsewhere); if it raises, nothing is committed. `same_bytes` names a
    local file (e.g. the weights of the checkpoint written at this step) a local export links instead of writing
    the same bytes again, when they are the same (``native_save``)."""
    if merged and not session.is_lora:
        raise WeightsError("merged=True applies to LoRA sessions only; a full-weight export is already merged")
    if state is not None and step is None:
        raise WeightsError("export_weights of a detached state needs the step it was taken at (step=...)")
    info: dict[str, Any] = {
        "label": label,
        "step": session.step if step is None else int(step),
        "architecture": session.architecture,
        "lora": session.is_lora,
        "base_model_hash": session.provenance["base_model_hash"],
        "merged": merged,
    }
    if thresholds is not None:
        info[THRESHOLDS_KEY] = dict(thresholds)
    if schema is not None:
        info["schema"] = dict(schema)
    try:
        commit = directory_commit(uri, EXPORT_MARKER_FILE, what="export", before_commit=before_commit, direct=True)
    except FileExistsError:
        raise WeightsError(f"export destination {uri} already exists and is not empty; choose a new location") from None
    with commit:
        staging = commit.local_dir()
        # local exports: the weights go around the page cache, hashed while written (``native_save``)
        writing: AbstractContextManager[dict[str, str]] = (
            weights_written_direct(staging, same_bytes) if commit.direct else nullcontext({})
        )
        with writing as digests:
            if not session.is_lora and state is None:
                unwrap(session.model).save_pretrained(str(staging))
            else:
                copy = session.engine.detached_model_copy(state)
                try:
                    _export_copy(copy, staging, merged=merged, lora=session.is_lora)
                finally:
                    del copy
        written = digests.get(MODEL_WEIGHTS_FILE)
        info["weights_sha256"] = written or file_tensors_digest(str(staging / MODEL_WEIGHTS_FILE))
        commit.commit(json.dumps(info, indent=1, sort_keys=True).encode())
    info["uri"] = uri
    return info


@contextmanager
def state_loaded(session: SessionWeights, state: Mapping[str, torch.Tensor] | None) -> Iterator[None]:
    """The live model holds `state` (a detached weights dict, e.g. the best validation weights) inside the block and
    its own weights again after it, bit for bit; None leaves the live weights in place."""
    if state is None:
        yield
        return
    live = session.model.state_dict()
    saved = {name: live[name].detach().clone() for name in state}
    with torch.no_grad():
        for name, tensor in state.items():
            live[name].copy_(tensor)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, tensor in saved.items():
                live[name].copy_(tensor)


def _export_copy(copy: Any, staging: Path, *, merged: bool, lora: bool) -> None:
    if not lora:
        unwrap(copy).save_pretrained(str(staging))
        return
    copy.save_pretrained(str(staging / ADAPTER_DIR))
    if merged:
        import copy as copy_mod

        merged_model = copy_mod.deepcopy(copy).merge_and_unload()
        merged_model.save_pretrained(str(staging / MERGED_DIR))
        del merged_model
    copy.unload().save_pretrained(str(staging))


def load_exported_model(uri: str, *, trainable: bool = False, **kwargs: Any) -> Any:
    """Load what export_weights wrote: the native model, with its LoRA adapter applied when there is one.

    A remote export is downloaded into a temporary directory that is removed before this returns (on every path;
    after a kill, by the next load or remote commit on the machine): the model is held in memory, nothing stays on
    disk. An export whose upload was interrupted (no export.json) is refused."""
    fs, path = resolve(uri)
    if not is_local(fs) and interrupted_commit(fs, path, EXPORT_MARKER_FILE):
        raise WeightsError(
            f"{uri} is an incomplete export (its upload was interrupted); resume the training run that writes it"
        )
    if is_local(fs):
        return _load_export_dir(Path(path), trainable, kwargs)
    clean_stale_temp()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}model-{os.getpid()}-") as scratch:
        target = Path(scratch) / "model"
        fs.get(f"{path}/", str(target), recursive=True)  # trailing slash: copy the contents into target
        return _load_export_dir(target, trainable, kwargs)


def _load_export_dir(local: Path, trainable: bool, kwargs: dict[str, Any]) -> Any:
    from prefect_gliner2.training.extractor_loading import load_extractor

    model = load_extractor(str(local), **kwargs)
    adapter = local / ADAPTER_DIR
    if adapter.is_dir():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    return model
