"""Reading an annotation file of any format into Documents, turning Documents into native records, and writing
Documents in a format (published atomically)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect_gliner2.session_core.errors import FormatError
from prefect_gliner2.session_core.formats.document import Document, data_labels, to_record
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.registry import AUTO, NATIVE, check_options, detect_format, get_format
from prefect_gliner2.session_core.storage import resolve, write_atomic

__all__ = ["Reading", "read_documents", "records_of", "resolve_format", "write_documents"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """What one file held: its format (and why, when detected), its documents and notes worth telling."""

    uri: str
    format: str
    documents: list[Document]
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{self.uri}: {len(self.documents)} document(s) as {self.format}{notes}"


def resolve_format(uri: str, fmt: str, options: FormatOptions) -> tuple[str, str | None]:
    """The format to read ``uri`` as (``auto`` detected from the file) and why, when detected; settings the format
    would not read are refused."""
    why = None
    if fmt == AUTO:
        fmt, why = detect_format(uri)
    get_format(fmt)
    check_options(fmt, options)
    return fmt, why


def read_documents(uri: str, fmt: str = AUTO, options: FormatOptions | None = None) -> Reading:
    """Every document of the file at ``uri`` (a path or fsspec URL) in format ``fmt`` (``auto``: detected)."""
    options = options or FormatOptions()
    fmt, why = resolve_format(uri, fmt, options)
    reader = get_format(fmt).read
    if reader is None:
        raise FormatError(f"{uri} holds gliner2's own records ({why or fmt}); load them with load_records")
    documents, notes = reader(uri, options)
    if why is not None:
        notes = [f"format {fmt} detected from {why}", *notes]
    for note in notes:
        logger.info("%s: %s", uri, note)
    return Reading(uri, fmt, documents, notes)


def records_of(readings: Sequence[Reading]) -> list[dict[str, Any]]:
    """The native records of every document read, each declaring every label of all the readings (sorted)."""
    documents = [document for reading in readings for document in reading.documents]
    labels = data_labels(documents)
    if not labels:
        files = ", ".join(reading.uri for reading in readings)
        raise FormatError(
            f"no entity labels in {files}: every document is unlabelled, so there is nothing to train; check the "
            "file's format and its options (--tag-column, --spans-key, --annotation)"
        )
    return [to_record(document, labels) for document in documents]


def write_documents(
    documents: Sequence[Document],
    uri: str,
    fmt: str,
    options: FormatOptions | None = None,
    *,
    predictions: bool = False,
    model_version: str = "",
) -> None:
    """Write ``documents`` to ``uri`` in format ``fmt``; Label Studio can mark them as a model's ``predictions``."""
    options = options or FormatOptions()
    if fmt == NATIVE or fmt == AUTO:
        raise FormatError(
            f"cannot write format {fmt!r} here; pass one of conll, spacy, spacy-jsonl, label-studio, doccano"
        )
    spec = get_format(fmt)
    assert spec.write is not None
    extra: dict[str, Any] = (
        {"predictions": predictions, "model_version": model_version} if fmt == "label-studio" else {}
    )
    data = spec.write(documents, options, **extra)
    fs, path = resolve(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    write_atomic(fs, path, data)
