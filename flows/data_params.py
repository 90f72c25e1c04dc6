"""The training flow's data-format parameter: a pydantic model for the Prefect run form, the same settings as the
command line's ``--format`` arguments (``session_core.formats.FormatOptions``).

``format`` auto detects each data file's format (CoNLL/BIO columns, spaCy DocBin or JSONL, Label Studio, doccano,
or gliner2's own records); a file it cannot tell is refused with a message asking for the format.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prefect_gliner2.session_core.formats import FormatOptions
from prefect_gliner2.session_core.records import planner_source

__all__ = ["DataSettings"]

FormatName = Literal["auto", "gliner2", "conll", "spacy", "spacy-jsonl", "label-studio", "doccano"]


class DataSettings(BaseModel):
    """The format of the training and validation files, and the settings of that format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: FormatName = Field(default="auto", description="Format of the data files; auto detects it from each file.")
    tag_column: int = Field(default=-1, description="CoNLL: the column holding the tag (-1: the last).")
    token_column: int = Field(default=0, description="CoNLL: the column holding the token (0: the first).")
    scheme: Literal["auto", "iob1", "iob2", "bioes", "bilou"] = Field(
        default="auto", description="CoNLL: the tag scheme; auto detects it from the tags."
    )
    spans_key: str | None = Field(
        default=None, description="spaCy: read the span group doc.spans[KEY] instead of doc.ents (empty: ents)."
    )
    annotation: Literal["only", "first", "last"] = Field(
        default="only", description="Label Studio: which of several annotations of a task to read (only: refuse)."
    )
    unannotated: Literal["error", "skip", "prediction"] = Field(
        default="error", description="Label Studio: a task without annotation is an error, skipped, or its prediction."
    )
    label_map: dict[str, str] = Field(
        default_factory=dict, description='Rename labels while reading, e.g. {"PER": "person"}.'
    )

    def options(self) -> FormatOptions:
        return FormatOptions(**self.model_dump(exclude={"format"}))

    def source(self, paths: str | list[str] | None, what: str) -> tuple[Any, list[str]]:
        """The files as the planner takes them, and what each converted file was read as."""
        return planner_source(paths, format=self.format, options=self.options(), what=what)
