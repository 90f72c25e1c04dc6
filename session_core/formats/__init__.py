"""Annotation formats in and out: read the files annotation teams have into gliner2 records, and write documents
(or a model's predictions) back in those formats. Torch-free (spaCy, for DocBin files only, is imported on use).

    format         reads                                                   module
    conll          CoNLL / BIO columns: IOB1, IOB2, BIOES, BILOU           conll
    spacy          spaCy DocBin (.spacy), with spaCy                       spacy_docbin
    spacy-jsonl    JSONL with character offsets (Doc.to_json, Prodigy)     spacy_jsonl
    label-studio   Label Studio JSON export: span labels, relations        label_studio
    doccano        doccano JSONL: sequence labeling, relations             doccano
    gliner2        gliner2's own records (read by session_core.records)    (records)

Each reader returns :class:`Document` objects (text, labelled character spans, relations; ``document``) and the
notes worth telling (a detected tag scheme, skipped tasks); :func:`records_of` turns them into native records whose
mentions are ``{"text", "start", "end"}`` spans, the form gliner2 2.1 trains at exactly those offsets (a mention
given as a plain string marks every occurrence of that text), with every label of the data declared in each
record (``[]`` where a document has none, so every label is trained as a negative there). Settings
(:class:`FormatOptions`) say which column holds a CoNLL tag, which spaCy span group or Label Studio annotation to
read, and how to rename labels. ``registry`` names the formats and detects one from a file; every problem is a
:class:`~prefect_gliner2.session_core.errors.FormatError` naming the file, line or record, offset and what to do.

    reading = read_documents("train.conll")                 # format detected; or read_documents(path, "conll")
    records = records_of([reading])                         # native records, offsets kept
    write_documents(reading.documents, "train.json", "label-studio")

``session_core.records.load_records(path, format="conll")`` loads such a file as training records directly.
"""

from __future__ import annotations

from prefect_gliner2.session_core.formats.convert import (
    Reading,
    read_documents,
    records_of,
    resolve_format,
    write_documents,
)
from prefect_gliner2.session_core.formats.document import Document, Relation, Span, from_record, to_record
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.registry import AUTO, FORMATS, NATIVE, detect_format, get_format

__all__ = [
    "AUTO",
    "FORMATS",
    "NATIVE",
    "Document",
    "FormatOptions",
    "Reading",
    "Relation",
    "Span",
    "detect_format",
    "from_record",
    "get_format",
    "read_documents",
    "records_of",
    "resolve_format",
    "to_record",
    "write_documents",
]
