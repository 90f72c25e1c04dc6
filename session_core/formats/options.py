"""The settings of the format readers and writers, in one frozen, validated object shared by the CLI, the run form
and the Python API; each format reads only its own (setting another format's is refused, never ignored)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from prefect_gliner2.session_core.errors import FormatError

__all__ = ["ANNOTATION_CHOICES", "SCHEMES", "UNANNOTATED_CHOICES", "FormatOptions"]

SCHEMES = ("auto", "iob1", "iob2", "bioes", "bilou")
ANNOTATION_CHOICES = ("only", "first", "last")
UNANNOTATED_CHOICES = ("error", "skip", "prediction")


@dataclass(frozen=True)
class FormatOptions:
    """How to read (and write) an annotation file.

    - ``tag_column`` / ``token_column`` (conll): which whitespace-separated column holds the tag (default the last,
      -1) and the token (default the first, 0).
    - ``scheme`` (conll): ``iob1``, ``iob2``, ``bioes`` or ``bilou``; ``auto`` detects it from the tags (reading) and
      writes ``iob2``.
    - ``spans_key`` (spacy, spacy-jsonl): read and write the span group ``doc.spans[KEY]`` (may overlap) instead of
      ``doc.ents``.
    - ``annotation`` (label-studio): with several annotations on a task, refuse (``only``) or take the ``first`` or
      ``last`` one; cancelled (skipped) annotations never count.
    - ``unannotated`` (label-studio): a task nobody annotated is an ``error``, is skipped (``skip``, counted in the
      notes), or contributes its model ``prediction`` (pre-annotations taken as they are).
    - ``label_map`` (every format): rename labels while reading, e.g. ``{"PER": "person"}`` (gliner2 reads label
      names as words); a label not in the map keeps its name.
    """

    tag_column: int = -1
    token_column: int = 0
    scheme: str = "auto"
    spans_key: str | None = None
    annotation: str = "only"
    unannotated: str = "error"
    label_map: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tag_column", "token_column"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise FormatError(f"{name} must be an integer column index (0 first, -1 last), got {value!r}")
        if self.tag_column == self.token_column:
            raise FormatError(f"tag_column and token_column are both {self.tag_column}; they must differ")
        for name, choices in (
            ("scheme", SCHEMES),
            ("annotation", ANNOTATION_CHOICES),
            ("unannotated", UNANNOTATED_CHOICES),
        ):
            if getattr(self, name) not in choices:
                raise FormatError(f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        if self.spans_key is not None and (not isinstance(self.spans_key, str) or not self.spans_key):
            raise FormatError(f"spans_key must be a non-empty span group name, got {self.spans_key!r}")
        if not isinstance(self.label_map, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v.strip() for k, v in self.label_map.items()
        ):
            raise FormatError(f"label_map must map label names to non-empty new names, got {self.label_map!r}")
        object.__setattr__(self, "label_map", dict(self.label_map))

    def changed(self) -> list[str]:
        """The settings that differ from their defaults."""
        default = FormatOptions()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]

    def label(self, name: str) -> str:
        return self.label_map.get(name, name)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
