"""An extraction job's output in an annotation format, for review in the tool a team uses: Label Studio tasks with
the model's pre-annotations (each region's score, the prediction's ``model_version`` and mean score), a spaCy
DocBin, CoNLL columns, doccano or spaCy JSONL. Corrections come back through ``prefect-gliner2 convert``.

Entities only: each predicted entity with its character offsets and confidence (gliner2's ``include_spans`` and
``include_confidence``). CoNLL and ``doc.ents`` hold one label per token, so for ``conll`` and ``spacy`` where
predictions overlap the higher-scoring one is kept (ties: the earlier, then the longer); the other formats keep every
prediction. The parts of a job in these formats carry each record's text, which the writer needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.formats import Document, Span, write_documents

__all__ = ["FLAT_FORMATS", "OUTPUT_FORMATS", "check_output_format", "document_of", "write_output"]

OUTPUT_FORMATS = ("jsonl", "label-studio", "spacy", "conll", "doccano", "spacy-jsonl")
FLAT_FORMATS = ("conll", "spacy")  # one label per token: overlapping predictions resolved by score


def check_output_format(name: str) -> None:
    if name not in OUTPUT_FORMATS:
        raise ConfigError(f"output format {name!r} is not one of {list(OUTPUT_FORMATS)}")


def document_of(line: Mapping[str, Any], flat: bool) -> Document:
    """One output line (with its ``text``) as a Document of the predicted entities."""
    text = str(line["text"])
    spans = []
    for label, found in (line["extraction"].get("entities") or {}).items():
        for item in found or []:
            if isinstance(item, Mapping) and "start" in item and "end" in item:
                score = item.get("confidence")
                spans.append(Span(int(item["start"]), int(item["end"]), str(label), _float(score)))
    if flat:
        spans = _non_overlapping(spans)
    return Document(text, tuple(spans), where=f"line {line['line']}", id=line.get("id")).normalized()


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _non_overlapping(spans: list[Span]) -> list[Span]:
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (-(s.score or 0.0), s.start, -(s.end - s.start), s.label)):
        if all(span.end <= other.start or other.end <= span.start for other in kept):
            kept.append(span)
    return kept


def write_output(lines: Iterable[bytes], out: str, output_format: str, model_version: str) -> None:
    """Write the job's output lines (JSON, each with its text) to ``out`` in ``output_format``."""
    flat = output_format in FLAT_FORMATS
    documents = [document_of(json.loads(raw), flat) for raw in lines if raw.strip()]
    write_documents(
        documents, out, output_format, predictions=output_format == "label-studio", model_version=model_version
    )
