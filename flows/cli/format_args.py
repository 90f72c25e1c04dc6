"""The annotation-format arguments of the commands that read data (``--format`` and the format settings), and
reading data files with them: gliner2's own JSONL stays a path list, any other format becomes checked records."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["format_arguments", "format_options", "read_files"]

FORMAT_NAMES = ("auto", "gliner2", "conll", "spacy", "spacy-jsonl", "label-studio", "doccano")


def format_arguments(parser: argparse.ArgumentParser, *, flag: str = "--format") -> None:
    """``flag`` (the format of the data files, default auto) and each format's settings."""
    group = parser.add_argument_group("data format (session_core.formats)")
    group.add_argument(
        flag,
        dest="data_format",
        choices=FORMAT_NAMES,
        default="auto",
        help="format of the data files (default auto: detected from each file; an undecidable file is refused)",
    )
    group.add_argument("--tag-column", type=int, help="conll: the column of the tag (default -1, the last)")
    group.add_argument("--token-column", type=int, help="conll: the column of the token (default 0, the first)")
    group.add_argument(
        "--scheme", choices=("auto", "iob1", "iob2", "bioes", "bilou"), help="conll: the tag scheme (default auto)"
    )
    group.add_argument("--spans-key", help="spacy, spacy-jsonl: read the span group doc.spans[KEY], not doc.ents")
    group.add_argument(
        "--annotation",
        choices=("only", "first", "last"),
        help="label-studio: which of several annotations of a task to read (default only: several are refused)",
    )
    group.add_argument(
        "--unannotated",
        choices=("error", "skip", "prediction"),
        help="label-studio: a task without annotation is an error (default), skipped, or read from its prediction",
    )
    group.add_argument(
        "--map-label",
        action="append",
        metavar="OLD=NEW",
        help="rename a label while reading, e.g. PER=person (repeatable; gliner2 reads label names as words)",
    )


def format_options(args: Any) -> Any:
    """The FormatOptions the arguments ask for (a FormatError, exit 2, on a malformed --map-label)."""
    from prefect_gliner2.session_core.errors import FormatError
    from prefect_gliner2.session_core.formats import FormatOptions

    values: dict[str, Any] = {}
    for name in ("tag_column", "token_column", "scheme", "spans_key", "annotation", "unannotated"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    mapping = {}
    for item in getattr(args, "map_label", None) or []:
        old, sep, new = item.partition("=")
        if not sep or not old or not new.strip():
            raise FormatError(f"--map-label {item!r}: pass OLD=NEW, e.g. PER=person")
        mapping[old] = new
    if mapping:
        values["label_map"] = mapping
    return FormatOptions(**values)


def read_files(paths: list[str] | None, args: Any, what: str) -> Any:
    """``paths`` as the planner takes them: unchanged when every file holds gliner2 records (and no format setting
    is given), else the checked records of every file; says on stderr what each converted file was read as."""
    from prefect_gliner2.session_core.records import planner_source

    source, files = planner_source(paths, format=args.data_format, options=format_options(args), what=what)
    for line in files:
        print(f"{what} data {line}", file=sys.stderr)
    return source
