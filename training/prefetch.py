"""A resume's head start: a checkpoint's state files read (and verified) in the background while the model loads.

Needs only torch and the checkpoint reader, not gliner2 or transformers (seconds of imports): a session worker
starts it as soon as it knows its checkpoint, before it imports them (``runtime.worker_child``).
"""

from __future__ import annotations

from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.checkpoint import prefetch_checkpoint
from prefect_gliner2.training.state import read_tensors

__all__ = ["PREFETCHED_FILES", "prefetch_state"]

#: The files a restore reads whole into new tensors, in the order it takes them (the weights stream into the live
#: parameters instead): RNG streams, pending gradients, optimizer moments, a managed run's best weights.
PREFETCHED_FILES = (layout.RNG_FILE, layout.GRADIENTS_FILE, layout.OPTIMIZER_TENSORS_FILE, layout.BEST_WEIGHTS_FILE)


def prefetch_state(uri: str) -> None:
    """Start reading (and verifying) the checkpoint's `PREFETCHED_FILES` in a background thread, for the next
    `load_state(uri)` in this process to take instead of reading them then: call it before building the model and
    session, and the largest part of a resume's reading (the optimizer moments and gradients are 3x the weights of a
    full fine-tune) overlaps that work. The same bytes land in the same tensors; a damaged file raises in
    `load_state` as it would without the prefetch. Index and sizes are checked here (CheckpointError). Like
    `load_state`, the files read leave the page cache (``checkpoint/reader.py``: ``read_once``)."""
    prefetch_checkpoint(uri, PREFETCHED_FILES, read_tensors, read_once=True)
