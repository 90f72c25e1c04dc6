"""The model registry: versioned model directories with lineage and an atomic ``CURRENT`` pointer (torch-free)."""

from __future__ import annotations

from .store import ModelRegistry, ModelVersion, RegistryError

__all__ = ["ModelRegistry", "ModelVersion", "RegistryError"]
