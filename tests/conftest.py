"""Test-wide settings: everything offline, quiet tokenizers, Prefect pointed at a throwaway home."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))
# One intra-op thread everywhere (this process and every child it spawns): faster on 2 cores, and the thread
# count is part of a checkpoint's compatibility, so parents and children must agree.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_GLINER2_CACHE", tempfile.mkdtemp(prefix="prefect-gliner2-cache-"))
