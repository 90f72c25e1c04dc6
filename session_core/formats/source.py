"""Reading annotation files from a path or fsspec URL (compression inferred from the name), and collecting every
problem of a file before one FormatError lists them with what to do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec

from prefect_gliner2.session_core.errors import ConfigError, FormatError

__all__ = ["MAX_LISTED", "Problems", "json_lines", "read_bytes", "read_head", "read_text", "text_lines"]

MAX_LISTED = 20


@dataclass
class Problems:
    """Every problem found in one file (the first ``MAX_LISTED`` listed); ``raise_if_any`` reports them at once."""

    uri: str
    fmt: str
    count: int = 0
    listed: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(message)

    def raise_if_any(self) -> None:
        if not self.count:
            return
        more = f"\n  ... and {self.count - len(self.listed)} more" if self.count > len(self.listed) else ""
        raise FormatError(
            f"{self.uri} cannot be read as {self.fmt}: {self.count} problem(s), nothing was converted; fix them (or "
            f"pass the right --format and its options) and read it again:\n  " + "\n  ".join(self.listed) + more
        )


def read_bytes(uri: str) -> bytes:
    """The whole file (decompressed when its name says so)."""
    return _read(uri, -1)


def read_head(uri: str, size: int) -> tuple[bytes, bool]:
    """The first ``size`` bytes (decompressed) and whether the file holds more."""
    data = _read(uri, size + 1)
    return data[:size], len(data) > size


def _read(uri: str, size: int) -> bytes:
    """Up to ``size`` bytes (all for -1); a path that names no file is a setting to fix (ConfigError), not a
    format problem."""
    try:
        with fsspec.open(uri, "rb", compression="infer") as handle:
            data: bytes = handle.read(size)
    except FileNotFoundError:
        raise ConfigError(f"{uri} does not exist; pass an existing file path or URL") from None
    except IsADirectoryError:
        raise ConfigError(f"{uri} is a directory; pass one file (repeat the option for several)") from None
    return data


def read_text(uri: str) -> str:
    """The whole file as UTF-8 (a byte-order mark dropped); an encoding error names the line and byte."""
    data = read_bytes(uri)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FormatError(
            f"{uri} line {line}: not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8"
        ) from None


def text_lines(uri: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its line break) of a text file."""
    for number, line in enumerate(read_text(uri).split("\n"), 1):
        yield number, line.rstrip("\r")


def json_lines(uri: str, problems: Problems) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line of a JSONL file; unparsable lines become problems."""
    for number, line in text_lines(uri):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as exc:
            problems.add(f"line {number}: invalid JSON ({exc}); each line must hold one JSON object")
