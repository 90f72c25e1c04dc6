"""The model an extraction job asks: a reference resolved to a model directory (a registry's CURRENT or named
version, an export, any gliner2 directory, a Hugging Face id or a built-in tiny model), what it records (fitted
thresholds, the labels it was trained with), and the batched extraction itself with gliner2's own long-text
chunking.

    ./model                        an export (export.json) or any gliner2 model directory
    ./registry/ner                 a registry model (model_registry.store): the version CURRENT points at
    ./registry/ner@v000002         a named version; any fsspec URL works, e.g. s3://bucket/registry/ner
    tiny:span:64x2, owner/name     a built-in tiny model, a Hugging Face id

Texts longer than ``chunk_size`` words (gliner2's own word splitter) go through gliner2's ``batch_extract_long``
(overlapping word windows, spans mapped back and merged); the rest through ``batch_extract``. Nothing is truncated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.model_registry.store import RegistryError
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.layout import (
    EXPORT_MARKER_FILE,
    MODEL_CONFIG_FILE,
    MODEL_WEIGHTS_FILE,
    REGISTRY_POINTER_FILE,
    REGISTRY_VERSIONS_DIR,
)
from prefect_gliner2.session_core.storage import absolute_uri, resolve

__all__ = ["EXPORT_LABELS_KEYS", "Extractor", "ModelRef", "loaded_extractor", "resolve_model"]

EXPORT_LABELS_KEYS = ("schema", "labels")  # where export.json may record what the model was trained to extract
_VERSION_SUFFIX = re.compile(r"^(?P<path>.+)@(?P<version>v\d{6})$")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: what was asked (`source`), what is loaded (`uri`), the registry version (None when not a
    registry model) and an identity that changes whenever the weights do (part of every cache key)."""

    source: str
    uri: str
    version: str | None
    identity: str
    export_info: Mapping[str, Any]

    def describe(self) -> str:
        return f"{self.source} ({self.version}: {self.uri})" if self.version else self.source

    def trained_schema(self) -> dict[str, Any] | None:
        """The schema the export records (export.json "schema", or its "labels" as entities); None when none."""
        schema = self.export_info.get("schema")
        if isinstance(schema, Mapping) and schema:
            return dict(schema)
        labels = self.export_info.get("labels")
        if isinstance(labels, list) and labels:
            return {"entities": [str(label) for label in labels]}
        return None


def resolve_model(source: str) -> ModelRef:
    """A model reference resolved to the directory to load (a registry reference pins its version now)."""
    from prefect_gliner2.runtime.model_sources import check_model_source, parse_tiny

    if not isinstance(source, str) or not source.strip():
        raise ConfigError("model must be a model directory, a registry model (ROOT/NAME[@v000001]) or a model id")
    if parse_tiny(source) is not None:
        from prefect_gliner2.training.tiny import TINY_MODEL_REVISION

        return ModelRef(source, source, None, f"{source}@{TINY_MODEL_REVISION}", {})
    match = _VERSION_SUFFIX.match(source)
    fs, path = resolve(match.group("path") if match else source)
    if fs.exists(f"{path}/{REGISTRY_VERSIONS_DIR}") or fs.exists(f"{path}/{REGISTRY_POINTER_FILE}"):
        return _registry_model(source, match.group("path") if match else source, match and match.group("version"))
    if match:
        raise RegistryError(f"model {source!r}: {match.group('path')!r} is not a registry model (no versions/ in it)")
    if fs.isdir(path):
        if not fs.exists(f"{path}/{MODEL_CONFIG_FILE}"):
            raise ConfigError(
                f"model {source!r} has no {MODEL_CONFIG_FILE}: pass an export, a registry model or a gliner2 directory"
            )
        uri = absolute_uri(source)
        info = _export_info(uri)
        return ModelRef(source, uri, None, _identity(uri, info), info)
    check_model_source(source)  # a Hugging Face id (or a clear error)
    return ModelRef(source, source, None, source, {})


def _registry_model(source: str, location: str, version: str | None) -> ModelRef:
    from prefect_gliner2.model_registry.store import ModelRegistry

    uri = absolute_uri(location).rstrip("/")
    root, _, name = uri.rpartition("/")
    registry = ModelRegistry(root, name)
    chosen = registry.get(version) if version else registry.current()
    if chosen is None:
        raise RegistryError(
            f"registry model {source!r} has no CURRENT version yet; promote one, or name a version: "
            f"{location}@{registry.versions()[-1].version if registry.versions() else 'v000001'}"
        )
    info = _export_info(chosen.uri)
    return ModelRef(source, chosen.uri, chosen.version, _identity(chosen.uri, info), info)


def _export_info(uri: str) -> dict[str, Any]:
    fs, path = resolve(uri)
    marker = f"{path}/{EXPORT_MARKER_FILE}"
    if not fs.exists(marker):
        return {}
    info = json.loads(fs.cat_file(marker))
    return dict(info) if isinstance(info, Mapping) else {}


def _identity(uri: str, info: Mapping[str, Any]) -> str:
    """The export's recorded weights digest, else the weights file's fsspec checksum (size and mtime or ETag)."""
    if info.get("weights_sha256"):
        return f"{uri}#sha256={info['weights_sha256']}"
    fs, path = resolve(uri)
    weights = f"{path}/{MODEL_WEIGHTS_FILE}"
    return f"{uri}#checksum={fs.checksum(weights) if fs.exists(weights) else 'none'}"


class Extractor:
    """A loaded model asked with one set of thresholds: ``extract(texts, schemas)`` -> (results, chunks per text)."""

    def __init__(
        self,
        ref: ModelRef,
        *,
        threshold: float,
        per_label: Any,
        batch_size: int,
        chunk_size: int,
        chunk_overlap: int,
        spans: bool = False,
    ) -> None:
        from prefect_gliner2.training.engine.native import word_splitter

        self.model = _load(ref)
        self.threshold = threshold
        self.per_label = per_label  # a Thresholds whose apply() writes per-label values into a schema
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.spans = spans  # each entity with its offsets and confidence (what annotation formats need)
        self._splitter = word_splitter(self.model)
        self._schemas: dict[str, Any] = {}

    def words(self, text: str) -> int:
        """How many words gliner2's word splitter finds in `text` (what its chunking counts)."""
        return sum(1 for _ in self._splitter(text, lower=False))

    def extract(self, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[int]]:
        """One result per text (gliner2's formatted payload) and how many chunks each text was split into (1: none)."""
        import torch

        built = [self._schema(schema) for schema in schemas]
        # a word is at least one character: a text no longer than chunk_size characters needs no counting
        long = [i for i, text in enumerate(texts) if len(text) > self.chunk_size and self.words(text) > self.chunk_size]
        chunked = set(long)
        short = [i for i in range(len(texts)) if i not in chunked]
        results: list[Any] = [None] * len(texts)
        chunks = [1] * len(texts)
        with torch.no_grad():
            if short:
                asked = [built[i] for i in short]
                out = self.model.batch_extract(
                    [texts[i] for i in short],
                    asked[0] if all(schema is asked[0] for schema in asked) else asked,
                    batch_size=self.batch_size,
                    threshold=self.threshold,
                    include_confidence=self.spans,
                    include_spans=self.spans,
                )
                for i, result in zip(short, out, strict=True):
                    results[i] = result
            if long:
                out = self.model.batch_extract_long(
                    [texts[i] for i in long],
                    [built[i] for i in long],
                    batch_size=self.batch_size,
                    threshold=self.threshold,
                    chunk_size=self.chunk_size,
                    chunk_overlap=self.chunk_overlap,
                    include_confidence=self.spans,
                    include_spans=self.spans,
                )
                for i, result in zip(long, out, strict=True):
                    results[i] = result
                    chunks[i] = self._chunk_count(texts[i])
        return results, chunks

    def _chunk_count(self, text: str) -> int:
        from prefect_gliner2.training.engine.native import chunk_count

        return chunk_count(text, self.chunk_size, self.chunk_overlap, self._splitter)

    def _schema(self, schema: Mapping[str, Any]) -> Any:
        """gliner2's Schema for a schema dict with the per-label thresholds in it (built once per distinct dict)."""
        key = json.dumps(schema, sort_keys=True)
        if key not in self._schemas:
            from gliner2 import Schema

            self._schemas[key] = Schema.from_dict(self.per_label.apply(schema))
        return self._schemas[key]


_LOADED: dict[str, Any] = {}


def loaded_extractor(ref: ModelRef, **settings: Any) -> Extractor:
    """The Extractor for `ref` and `settings`, loaded once per process (flow tasks reuse it; one model is kept)."""
    key = json.dumps(
        [ref.identity, repr(settings.get("per_label"))] + sorted((k, repr(v)) for k, v in settings.items())
    )
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = Extractor(ref, **settings)
    extractor: Extractor = _LOADED[key]
    return extractor


def _load(ref: ModelRef) -> Any:
    from prefect_gliner2.runtime.model_sources import load_model
    from prefect_gliner2.training.weights import load_exported_model

    fs, path = resolve(ref.uri) if "://" in ref.uri or ref.uri.startswith("/") else (None, None)
    if fs is not None and fs.isdir(path):
        return load_exported_model(ref.uri)
    return load_model(ref.uri)
