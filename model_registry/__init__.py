"""The model registry: versioned model directories with lineage and an atomic ``CURRENT`` pointer (torch-free)."""

from __future__ import annotations

if __name__ != "prefect_gliner2.model_registry":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.model_registry, not {__name__}: a second copy would split every class")

from prefect_gliner2.model_registry.store import ModelRegistry, ModelVersion, RegistryError

__all__ = ["ModelRegistry", "ModelVersion", "RegistryError"]
