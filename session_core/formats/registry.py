"""The formats by name: what each reads and writes, the settings it takes, and format detection from a file.

Detection (``detect_format``) looks at the name, then at the content: ``.spacy`` is a DocBin; a JSON array (or a
JSON object per line) of tasks with ``data`` is a Label Studio export; a JSON object per line is doccano when its
spans are ``[start, end, label]`` under ``label`` or ``{start_offset, end_offset}`` entities, spaCy JSONL when they
are under ``ents``/``spans`` or ``entities`` triples, and otherwise gliner2's own records (whose loader explains
what is wrong with them); token/tag columns are CoNLL. Anything else is not guessed: the error asks for the format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import prefect_gliner2.session_core.formats.conll as conll
import prefect_gliner2.session_core.formats.doccano as doccano
import prefect_gliner2.session_core.formats.label_studio as label_studio
import prefect_gliner2.session_core.formats.spacy_docbin as spacy_docbin
import prefect_gliner2.session_core.formats.spacy_jsonl as spacy_jsonl
from prefect_gliner2.session_core.errors import FormatError
from prefect_gliner2.session_core.formats.document import Document
from prefect_gliner2.session_core.formats.options import FormatOptions
from prefect_gliner2.session_core.formats.source import read_bytes, read_head

__all__ = ["AUTO", "FORMATS", "NATIVE", "Format", "check_options", "detect_format", "get_format"]

AUTO = "auto"
NATIVE = "gliner2"  # gliner2's own JSONL records, read by session_core.records
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
_HEAD_BYTES = 1 << 16

Reader = Callable[[str, FormatOptions], tuple[list[Document], list[str]]]


@dataclass(frozen=True)
class Format:
    """One annotation format: its name, what it is, the settings it reads, its reader and writer."""

    name: str
    description: str
    options: frozenset[str]
    read: Reader | None
    write: Callable[..., bytes] | None
    suffix: str


_ALL = frozenset({"label_map"})
FORMATS: dict[str, Format] = {
    fmt.name: fmt
    for fmt in (
        Format(NATIVE, "gliner2's own records {input, output} (JSONL)", frozenset(), None, None, ".jsonl"),
        Format(
            "conll",
            "CoNLL / BIO token-tag columns (IOB1, IOB2, BIOES, BILOU)",
            _ALL | {"tag_column", "token_column", "scheme"},
            conll.read,
            conll.write,
            ".conll",
        ),
        Format("spacy", "spaCy DocBin (.spacy)", _ALL | {"spans_key"}, spacy_docbin.read, spacy_docbin.write, ".spacy"),
        Format(
            "spacy-jsonl",
            "spaCy-style JSONL with character offsets (ents / spans / entities)",
            _ALL | {"spans_key"},
            spacy_jsonl.read,
            spacy_jsonl.write,
            ".jsonl",
        ),
        Format(
            "label-studio",
            "Label Studio JSON export (span labels, relations)",
            _ALL | {"annotation", "unannotated"},
            label_studio.read,
            label_studio.write,
            ".json",
        ),
        Format("doccano", "doccano JSONL export (spans, relations)", _ALL, doccano.read, doccano.write, ".jsonl"),
    )
}


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise FormatError(f"unknown format {name!r}; pass one of {sorted(FORMATS)} (or auto to detect it)")
    return FORMATS[name]


def check_options(name: str, options: FormatOptions) -> None:
    """Refuse settings the format does not read (they would be ignored)."""
    unused = [option for option in options.changed() if option not in get_format(name).options]
    if unused:
        flags = ", ".join("--" + option.replace("_", "-") for option in unused)
        raise FormatError(f"{flags} do(es) not apply to {name} files; remove it, or pass the file's right --format")


def detect_format(uri: str) -> tuple[str, str]:
    """The format of the file at ``uri`` and why; a FormatError asking for ``--format`` when it cannot tell."""
    name = uri.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    if name.endswith(".spacy"):
        return "spacy", "the .spacy name"
    data, more = read_head(uri, _HEAD_BYTES)
    head = data.decode("utf-8", errors="replace").lstrip("\ufeff")
    stripped = head.lstrip()
    if stripped.startswith("["):
        return _json_array(uri, read_bytes(uri))
    if stripped.startswith("{"):
        first = stripped.split("\n", 1)[0]
        try:
            item = json.loads(first)
        except ValueError:
            return NATIVE, "JSON lines"  # the records loader names the line and what is wrong
        return _json_line(item)
    lines = head.split("\n")[:200]
    if conll.looks_like_conll(lines[:-1] if more else lines):
        return "conll", "token and tag columns"
    raise FormatError(
        f"cannot tell the format of {uri} (neither JSON nor token/tag columns in its first lines); pass --format "
        f"({', '.join(sorted(FORMATS))})"
    )


def _json_array(uri: str, data: bytes) -> tuple[str, str]:
    try:
        items = json.loads(data.decode("utf-8-sig"))
    except ValueError as exc:
        raise FormatError(
            f"{uri} starts like a JSON array but is not valid JSON ({exc}); fix or re-export it"
        ) from None
    if isinstance(items, list) and items and label_studio.is_task(items[0]):
        return "label-studio", "a JSON array of tasks with 'data'"
    raise FormatError(
        f"{uri} is a JSON array but not of Label Studio tasks (objects with 'data' and 'annotations'); Label Studio's "
        "JSON-MIN export is not read: export as JSON, or pass --format"
    )


def _json_line(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        return NATIVE, "JSON lines"
    if label_studio.is_task(item):
        return "label-studio", "one Label Studio task per line"
    if "input" in item or "output" in item or "schema" in item:
        return NATIVE, "records with input/output"
    if doccano.is_doccano_record(item):
        return "doccano", "'label' [start, end, label] spans or start_offset/end_offset entities"
    if spacy_jsonl.is_spacy_record(item):
        return "spacy-jsonl", "'ents'/'spans' or [start, end, label] entities"
    return NATIVE, "JSON lines"
