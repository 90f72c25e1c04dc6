"""Atomic, hash-verified checkpoint directories on any fsspec storage, written and read as streams (torch-free).

A checkpoint is a directory of named files plus its index, ``checkpoint.json``, written last: the commit. It lists
every file with its digest and size, the format version, a small `meta` dict, and references to blobs kept in a
content-addressed store beside the checkpoints. Files are written through a hashing stream and read back through a
verifying one: no file is ever held whole in memory, and a damaged file raises CheckpointDamagedError.

    format.py   the index, its version, digests and on-disk names (what a checkpoint is)
    digest.py   the file digests (BLAKE3; sha256 schemes of older formats) computed in helper threads during I/O
    writer.py   write_checkpoint (an atomic directory commit) and store_blob (the blob store)
    reader.py   open_checkpoint / read_checkpoint, Checkpoint and its VerifiedReader, index-only queries,
                prefetch_checkpoint (files read in the background while the caller builds a session)
"""

from __future__ import annotations

from prefect_gliner2.session_core.checkpoint.digest import set_hash_threads
from prefect_gliner2.session_core.checkpoint.format import (
    BLOB_DIR,
    FORMAT_VERSION,
    RESUMABLE_VERSION,
    FileRef,
    is_blob_name,
)
from prefect_gliner2.session_core.checkpoint.reader import (
    Checkpoint,
    VerifiedReader,
    checkpoint_exists,
    checkpoint_meta,
    checkpoint_refs,
    discard_prefetch,
    open_checkpoint,
    prefetch_checkpoint,
    read_checkpoint,
)
from prefect_gliner2.session_core.checkpoint.writer import Payload, store_blob, write_checkpoint

__all__ = [
    "BLOB_DIR",
    "FORMAT_VERSION",
    "RESUMABLE_VERSION",
    "Checkpoint",
    "FileRef",
    "Payload",
    "VerifiedReader",
    "checkpoint_exists",
    "checkpoint_meta",
    "checkpoint_refs",
    "discard_prefetch",
    "is_blob_name",
    "open_checkpoint",
    "prefetch_checkpoint",
    "read_checkpoint",
    "set_hash_threads",
    "store_blob",
    "write_checkpoint",
]
