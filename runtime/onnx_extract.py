"""Extraction on an ONNX export through the gliner2-onnx runtime, in gliner2's own result format: what
``prefect-gliner2 extract --runtime onnx``, the extraction flow's ``runtime="onnx"`` and the parity gate run.

The runtime (``GLiNER2ONNXRuntime(directory, precision=...)``, loaded unchanged) extracts one text per call. Around
it, this module does what gliner2's ``batch_extract`` does around the model, so both runtimes write the same lines:

- the text gliner2 encodes: a text not ending in ``.``, ``!`` or ``?`` gets a ``.`` appended (gliner2's
  collation does; the runtime does not), and a long text's window is cut after ``chunk_size`` words (gliner2's
  ``max_len``);
- per-label thresholds: the runtime is asked at the lowest label threshold and each label keeps its spans at or
  above its own (its overlap decoding is per label, so this equals asking each label at its own threshold);
- the payload: labels in the schema's order, gliner2's formatting (``session_core.onnx_payload``);
- long texts: gliner2's own windows and merge (``training.engine.windows``), as ``batch_extract_long`` does.

A text whose words the runtime would split otherwise than gliner2 (it lower-cases the text before matching words,
and its word pattern lacks Unicode combining marks) is refused with its position: the runtime would score other
words than the model saw. The schema must be one the runtime covers (``session_core.onnx_scope``).
"""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.onnx_payload import Span, detailed_payload, plain_payload, spans_by_label
from prefect_gliner2.session_core.onnx_scope import check_schema, entity_thresholds
from prefect_gliner2.session_core.storage import is_local, resolve
from prefect_gliner2.session_core.thresholds import Thresholds

__all__ = ["OnnxExtractor", "load_runtime", "loaded_onnx_extractor"]

_ENDINGS = (".", "!", "?")
T = TypeVar("T")


def load_runtime(directory: str, precision: str, *, threads: int | None = None) -> Any:
    """``GLiNER2ONNXRuntime(directory, precision=precision)``, its ONNX Runtime sessions on `threads` intra-op
    threads when given (the runtime's default: one per physical core). A remote directory is copied locally first
    (and removed once loaded: the sessions hold the graphs in memory)."""
    fs, path = resolve(directory)
    if is_local(fs):
        return _runtime_class(threads)(path, precision=precision)
    scratch = tempfile.mkdtemp(prefix="prefect-gliner2-onnx-")
    try:
        fs.get(f"{path.rstrip('/')}/", scratch, recursive=True)
        return _runtime_class(threads)(scratch, precision=precision)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _runtime_class(threads: int | None) -> Any:
    import onnxruntime as ort
    from gliner2_onnx import GLiNER2ONNXRuntime

    ort.set_default_logger_severity(3)  # errors only: fp16 graphs log a constant-folding note per MatMul

    if threads is None:
        return GLiNER2ONNXRuntime

    class ThreadedRuntime(GLiNER2ONNXRuntime):  # type: ignore[misc]
        """The runtime with its sessions' intra-op thread count set (its constructor takes none)."""

        def _load_model(self, path: Any, providers: list[str]) -> Any:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)

    return ThreadedRuntime


class OnnxExtractor:
    """An ONNX export asked with one set of thresholds: ``extract(texts, schemas)`` -> (results, chunks per text),
    as ``runtime.extract_model.Extractor`` does with the torch model."""

    def __init__(
        self,
        directory: str,
        precision: str,
        *,
        per_label: Thresholds,
        chunk_size: int,
        chunk_overlap: int,
        threads: int | None = None,
        spans: bool = False,
    ) -> None:
        from prefect_gliner2.training.engine.windows import whitespace_splitter

        # `threads` > 1: that many sessions of one intra-op thread each, texts extracted on them at once (the runtime
        # runs one text per pass, too small to split over threads); otherwise one session on `threads` threads
        self.workers = threads if threads is not None and threads > 1 else 1
        self.runtime = load_runtime(directory, precision, threads=1 if self.workers > 1 else threads)
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle.put(self.runtime)
        for _ in range(self.workers - 1):
            self._idle.put(load_runtime(directory, precision, threads=1))
        self.per_label = per_label
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.spans = spans  # each entity with its offsets and confidence (what annotation formats need)
        self._splitter = whitespace_splitter()
        self._asked: dict[str, dict[str, float]] = {}

    def words(self, text: str) -> int:
        """How many words gliner2's word splitter finds in `text` (what its chunking counts)."""
        return sum(1 for _ in self._splitter(text, lower=False))

    def extract(self, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[int]]:
        """One payload per text (plain; with `spans`, each entity's offsets and confidence) and how many windows each
        text was split into (1: none)."""
        from prefect_gliner2.training.engine.windows import merge_windows, split_windows

        def one(text: str, schema: Mapping[str, Any]) -> tuple[Any, int]:
            thresholds = self._thresholds(schema)
            if len(text) > self.chunk_size and self.words(text) > self.chunk_size:
                windows = split_windows(text, self.chunk_size, self.chunk_overlap, self._splitter)
                parts = [self._detailed(window.text, thresholds, max_words=self.chunk_size) for window in windows]
                return merge_windows(text, windows, parts, details=self.spans), len(windows)
            detailed = self._detailed(text, thresholds)
            return (detailed if self.spans else plain_payload(detailed)), 1

        done = self._each(one, texts, schemas)
        return [result for result, _ in done], [chunks for _, chunks in done]

    def extract_detailed(self, texts: Sequence[str], schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Each text's payload with confidences and offsets (no windows: what ``batch_extract`` returns with
        ``include_confidence`` and ``include_spans``); the parity gate compares these."""
        return self._each(lambda text, s: self._detailed(text, self._thresholds(s)), texts, schemas)

    def _each(self, fn: Callable[[str, Mapping[str, Any]], T], texts: Sequence[str], schemas: Sequence[Any]) -> list[T]:
        """`fn` over the (text, schema) pairs, in order; on several sessions at once when there are (each text's
        result depends on that text alone, so the results are those of one session; the first error in text
        order is raised)."""
        if len(texts) != len(schemas):
            raise ValueError(f"{len(texts)} texts and {len(schemas)} schemas: pass one schema per text")
        if self.workers == 1 or len(texts) < 2:
            return [fn(text, schema) for text, schema in zip(texts, schemas, strict=True)]
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="onnx-extract") as pool:
            return list(pool.map(fn, texts, schemas))

    def _thresholds(self, schema: Mapping[str, Any]) -> dict[str, float]:
        """Each label of `schema` with its threshold, in the schema's order (checked once per distinct schema)."""
        key = json.dumps(schema)  # key order is label order: not sorted
        if key not in self._asked:
            applied = self.per_label.apply(schema)
            check_schema(applied, "this schema")
            self._asked[key] = entity_thresholds(applied, self.per_label.threshold)
        return self._asked[key]

    def _detailed(self, text: str, thresholds: Mapping[str, float], max_words: int | None = None) -> dict[str, Any]:
        seen = _encoded_text(text, self._splitter, max_words)
        _check_words(seen, self._splitter)
        labels = list(thresholds)
        runtime = self._idle.get()  # a session no other thread is using
        try:
            found = runtime.extract_entities(seen, labels, threshold=min(thresholds.values()))
        finally:
            self._idle.put(runtime)
        candidates: list[tuple[str, Span]] = [
            (entity.label, (seen[entity.start : entity.end].strip(), float(entity.score), entity.start, entity.end))
            for entity in found
        ]
        return detailed_payload(spans_by_label(candidates, thresholds))


def _encoded_text(text: str, splitter: Any, max_words: int | None) -> str:
    """The text gliner2 encodes: punctuation appended (``_normalize_text``), cut after `max_words` words."""
    seen = text + "." if not text.endswith(_ENDINGS) else text
    if max_words is not None:
        words = list(splitter(seen, lower=False))
        if len(words) > max_words:
            seen = seen[: words[max_words - 1][2]]
    return seen


def _check_words(text: str, splitter: Any) -> None:
    from gliner2_onnx.constants import WORD_PATTERN

    ours = [(start, end) for _, start, end in splitter(text, lower=False)]
    theirs = [(match.start(), match.end()) for match in WORD_PATTERN.finditer(text.lower())]
    if ours != theirs:
        where = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
        )
        at = ours[where][0] if where < len(ours) else len(text)
        raise ConfigError(
            f"the ONNX runtime splits the words of the text {text[:60]!r}{'...' if len(text) > 60 else ''} "
            f"otherwise than gliner2 from character {at} (its word pattern lower-cases the text first and lacks "
            "Unicode combining marks), so it would score other words than the model saw; extract this input with "
            "--runtime torch"
        )


_LOADED: dict[str, OnnxExtractor] = {}


def loaded_onnx_extractor(ref: Any, precision: str, *, per_label: Thresholds, **settings: Any) -> OnnxExtractor:
    """The OnnxExtractor for the ONNX export `ref` (a ModelRef), loaded once per process (one is kept)."""
    key = json.dumps([ref.identity, precision, repr(per_label), sorted((k, repr(v)) for k, v in settings.items())])
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = OnnxExtractor(ref.uri, precision, per_label=per_label, **settings)
    return _LOADED[key]
