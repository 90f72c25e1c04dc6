"""A native model directory whose weights are written around the page cache, byte for byte what gliner2 writes.

An export is written once and read later by someone else (``extract``, a deployment, another run); writing its
weights through the page cache makes the end of a run wait for the cache to find a page for every 4 KiB (see
``direct_io``). gliner2's ``save_pretrained`` (2.1: span and boundary models) writes the weights with safetensors'
``save_file``; while ``weights_written_direct`` is active, that function, for files inside the export's staging
directory, streams the same bytes (``state.write_tensors(like_save_file=True)``) into a ``direct_io`` file, and
hashes the same tensors (``tensors_digest``, the export's ``weights_sha256``) in a helper thread meanwhile, so the
export need not read its weights back to hash them. Everything else gliner2 writes (configs, tokenizer) and every
call it cannot take over exactly (metadata, tensors sharing memory or not contiguous, a dtype checkpoints cannot
store, an existing file) goes to safetensors unchanged. Should a later gliner2 write its weights another way, its
own writer runs and nothing is recorded: the caller hashes the file as before. The rebinding inside gliner2's
modules is the engine's (``engine.native.save_file_replaced``).

The swap is process-wide while active (the session worker runs one export at a time; other threads' calls for
other paths go to safetensors unchanged) and always undone.

When the caller names a committed local file that may already hold those bytes (``SameBytes``: the weights file of
the checkpoint the worker wrote at the exported step, with its index entry), the bytes the write would produce are
hashed the way the checkpoint hashed its file (BLAKE3 over the same stream, nothing written); when digest and size
match, the export's file is a hard link to that file instead of a second copy of the weights. A run's last
checkpoint and its export then share one file on disk (a link, not a copy: editing one in place would change the
other; checkpoints and exports are never edited, and pruning the checkpoint leaves the export's file in place).
Anything else (another digest, another filesystem, a remote export, a failed link) writes the bytes as above.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from prefect_gliner2.session_core.checkpoint.format import BLAKE3, RESUMABLE_VERSION, check_index, load_index
from prefect_gliner2.session_core.checkpoint.writer import payload_entry
from prefect_gliner2.session_core.direct_io import open_direct
from prefect_gliner2.session_core.errors import CheckpointError
from prefect_gliner2.session_core.layout import WEIGHTS_FILE
from prefect_gliner2.session_core.storage import is_local, resolve
from prefect_gliner2.training.engine.native import save_file_replaced
from prefect_gliner2.training.state import SAFETENSORS_RANK, tensors_digest, write_tensors

__all__ = ["SameBytes", "checkpoint_weights_file", "weights_written_direct"]


@dataclass(frozen=True)
class SameBytes:
    """A committed local file that may hold the bytes of a weights file about to be written: its `path` and its
    checkpoint index entry (`blake3`, `bytes`)."""

    path: str
    blake3: str
    bytes: int


def checkpoint_weights_file(uri: str) -> SameBytes | None:
    """The weights file of the committed local checkpoint at `uri` as a ``SameBytes`` (None: remote, no index, an
    index without a BLAKE3 entry for the weights, or weights kept in the blob store)."""
    fs, path = resolve(uri)
    if not is_local(fs):
        return None
    try:
        index = load_index(fs, path, uri)
        if index is None:
            return None
        check_index(index, uri, RESUMABLE_VERSION)
    except CheckpointError:
        return None
    entry = dict(index.get("files") or {}).get(WEIGHTS_FILE)
    if not isinstance(entry, dict):
        return None
    digest, size = entry.get(BLAKE3.key), entry.get("bytes")
    if not isinstance(digest, str) or not isinstance(size, int):
        return None
    return SameBytes(os.path.join(path, WEIGHTS_FILE), digest, size)


@contextmanager
def weights_written_direct(directory: Path, same: SameBytes | None = None) -> Iterator[dict[str, str]]:
    """Inside: safetensors' ``save_file`` writes files under `directory` around the page cache, or links `same`
    where it holds the same bytes (module docstring). Yields a dict it fills: each such file's path relative to
    `directory` -> ``tensors_digest`` of its tensors."""
    original = safetensors.torch.save_file
    root = directory.resolve()
    digests: dict[str, str] = {}

    def save_file(tensors: dict[str, torch.Tensor], filename: Any, metadata: Any = None) -> None:
        path = Path(filename).resolve()
        if metadata is not None or root not in path.parents or path.exists() or not _exact(tensors):
            original(tensors, filename, metadata=metadata)
            return
        digest: list[str] = []
        failure: list[BaseException] = []

        def hash_them() -> None:
            try:
                digest.append(tensors_digest(tensors.items()))
            except BaseException as exc:  # noqa: BLE001  (raised below, in the caller's thread)
                failure.append(exc)

        hasher = threading.Thread(target=hash_them, name="export-digest")
        hasher.start()
        try:
            if not _linked(tensors, path, same):
                with open_direct(path) as handle:
                    write_tensors(handle, tensors, like_save_file=True)  # type: ignore[arg-type]
        finally:
            hasher.join()
        if failure:
            raise failure[0]
        digests[path.relative_to(root).as_posix()] = digest[0]

    safetensors.torch.save_file = save_file
    try:
        with save_file_replaced(original, save_file):
            yield digests
    finally:
        safetensors.torch.save_file = original


def _linked(tensors: Mapping[str, torch.Tensor], path: Path, same: SameBytes | None) -> bool:
    """Hard-link `same` at `path` when it holds what ``write_tensors(like_save_file=True)`` would write for
    `tensors` (its BLAKE3 digest and size, as its checkpoint recorded them and as it is on disk); False otherwise,
    with nothing left at `path`."""
    if same is None:
        return False
    wanted = payload_entry(lambda handle: write_tensors(handle, tensors, like_save_file=True))
    if wanted != {BLAKE3.key: same.blake3, "bytes": same.bytes}:
        return False
    try:
        if os.stat(same.path).st_size != same.bytes:
            return False
        os.link(same.path, path)
    except OSError:
        return False
    return True


def _exact(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``write_tensors`` writes exactly what ``save_file`` would for `tensors` (else save_file runs, and
    raises where it raises): contiguous tensors of dtypes both know, none sharing memory."""
    seen: set[tuple[str, int]] = set()
    for tensor in tensors.values():
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in SAFETENSORS_RANK:
            return False
        if not tensor.is_contiguous():
            return False
        if tensor.numel():
            key = (str(tensor.device), tensor.untyped_storage().data_ptr())
            if key in seen:
                return False
            seen.add(key)
    return True
