"""gliner2's result payload for an entity task, built from scored spans the way gliner2 2.1 formats its own
(torch-free): what the ONNX runtime's extractions become, so that both runtimes write the same lines.

A span is ``(text, confidence, start, end)`` with character offsets into the text gliner2 saw. gliner2 keeps, per
label, the spans at or above the label's threshold, ranks them by confidence (stable: ties keep their text order)
and drops every span overlapping one already kept; its payload lists the labels in the schema's order:

    detailed (include_confidence and include_spans):
        {"entities": {"person": [{"text": "Ann", "confidence": 0.91, "start": 0, "end": 3}, ...], "city": []}}
    plain (the default, what ``extract`` writes):
        {"entities": {"person": ["Ann", ...], "city": []}}     a text listed once per label (case-insensitively)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Span", "detailed_payload", "plain_payload", "scored_spans", "spans_by_label"]

Span = tuple[str, float, int, int]  # text, confidence, start, end


def spans_by_label(candidates: Iterable[tuple[str, Span]], thresholds: Mapping[str, float]) -> dict[str, list[Span]]:
    """gliner2's per-label decoding of (label, span) candidates: threshold, rank by confidence, drop overlaps."""
    ranked: dict[str, list[Span]] = {label: [] for label in thresholds}
    for label, span in candidates:
        if label in ranked and span[1] >= thresholds[label]:
            ranked[label].append(span)
    decoded = {}
    for label, spans in ranked.items():
        kept: list[Span] = []
        for span in sorted(spans, key=lambda s: s[1], reverse=True):
            if not any(span[2] < other[3] and other[2] < span[3] for other in kept):
                kept.append(span)
        decoded[label] = kept
    return decoded


def detailed_payload(decoded: Mapping[str, Sequence[Span]]) -> dict[str, Any]:
    """The payload gliner2 returns with ``include_confidence`` and ``include_spans``."""
    entities = {}
    for label, spans in decoded.items():
        seen: set[tuple[str, int, int]] = set()
        items = []
        for text, confidence, start, end in spans:
            key = (text.lower(), start, end)
            if text and key not in seen:
                seen.add(key)
                items.append({"text": text, "confidence": confidence, "start": start, "end": end})
        entities[label] = items
    return {"entities": entities}


def plain_payload(detailed: Mapping[str, Any]) -> dict[str, Any]:
    """The plain payload of a detailed one: texts only, each listed once per label (case-insensitively)."""
    out: dict[str, Any] = {}
    for task, value in detailed.items():
        if task != "entities" or not isinstance(value, Mapping):
            out[task] = value
            continue
        labels = {}
        for label, items in value.items():
            seen: set[str] = set()
            texts = []
            for item in items:
                text = item["text"] if isinstance(item, Mapping) else str(item)
                if text and text.lower() not in seen:
                    seen.add(text.lower())
                    texts.append(text)
            labels[label] = texts
        out[task] = labels
    return out


def scored_spans(detailed: Mapping[str, Any]) -> dict[tuple[str, int, int], float]:
    """(label, start, end) -> confidence for every span of a detailed payload."""
    entities = detailed.get("entities") or {}
    return {
        (str(label), int(item["start"]), int(item["end"])): float(item["confidence"])
        for label, items in entities.items()
        for item in items
    }
