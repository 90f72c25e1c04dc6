"""Random streams around gliner2's preprocessing: a session's private Python stream, and blocks that draw nothing.

Touches one gliner2 internal: the ``random`` module reference of ``gliner2.processor``, swapped for the session's
own ``random.Random`` during the session's operations.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["preserved_rng", "private_python_rng"]


@contextlib.contextmanager
def private_python_rng(rng: random.Random) -> Iterator[None]:
    """Route gliner2's preprocessing (`gliner2.processor.random`) to a session's own Python random stream."""
    import gliner2.processor as processor_module

    previous = processor_module.random
    processor_module.random = rng  # type: ignore[assignment]
    try:
        yield
    finally:
        processor_module.random = previous


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Run a block without consuming any Python, NumPy, Torch or CUDA random state."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
