"""The four graphs the gliner2-onnx runtime runs, as torch modules over a span model's own layers.

``gliner2-onnx`` (PyPI, 0.1.x) loads a directory of four ONNX graphs per precision and drives them itself:

    encoder       input_ids [B, T], attention_mask [B, T]          -> hidden_states [B, T, H]
    span_rep      hidden_states [B, T, H], span_start_idx [B, S],
                  span_end_idx [B, S] (token positions)             -> span_representations [B, S, H]
    count_embed   label_embeddings [L, H]                           -> label_queries [L, H]
    classifier    hidden_state [L, H]                               -> logits [L, 1]

It scores a span against a label as ``sigmoid(span_representation . label_query)``, which is what gliner2 2.1's
factorised ``SpanMarkerV0.score_queries`` computes for an entity task whose count head predicts one instance
(entity decoding reads count-aware query 0, and query 0 of every counting layer does not depend on the count).
The modules here reuse the model's layers, so the exported weights are the model's own.

Touches gliner2 internals: ``model.encoder``, ``model.span_rep.span_rep_layer`` (``project_start``,
``project_end``, ``out_project``), ``model.count_embed``, ``model.classifier``, ``model.config`` (``token_pooling``,
``counting_layer``), ``model.max_width`` and ``model.processor`` (its tokenizer and word splitter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GRAPH_NAMES", "RUNTIME_SPECIAL_TOKENS", "GraphSpec", "graph_specs", "model_facts", "unsupported"]

GRAPH_NAMES = ("encoder", "span_rep", "count_embed", "classifier")  # the keys of gliner2_config.json's onnx_files
RUNTIME_SPECIAL_TOKENS = ("[P]", "[L]", "[E]", "[SEP_TEXT]")  # the ids gliner2-onnx needs, plus [C], [R] recorded


@dataclass(frozen=True)
class GraphSpec:
    """One graph to export: its module, example inputs, the runtime's input/output names and dynamic axes."""

    name: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]


class _Encoder(torch.nn.Module):
    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _SpanRep(torch.nn.Module):
    """SpanMarkerV0 at given (start, end) token positions: out_project(relu(cat(start_proj, end_proj)))."""

    def __init__(self, marker: torch.nn.Module) -> None:
        super().__init__()
        self.marker: Any = marker

    def forward(
        self, hidden_states: torch.Tensor, span_start_idx: torch.Tensor, span_end_idx: torch.Tensor
    ) -> torch.Tensor:
        starts = self.marker.project_start(hidden_states)
        ends = self.marker.project_end(hidden_states)
        size = starts.shape[-1]
        start_rep = torch.gather(starts, 1, span_start_idx.unsqueeze(-1).expand(-1, -1, size))
        end_rep = torch.gather(ends, 1, span_end_idx.unsqueeze(-1).expand(-1, -1, size))
        return self.marker.out_project(torch.cat([start_rep, end_rep], dim=-1).relu())


class _CountEmbed(torch.nn.Module):
    """The count-aware query of instance 0 (what entity decoding reads), for one predicted instance."""

    def __init__(self, count_embed: torch.nn.Module) -> None:
        super().__init__()
        self.count_embed = count_embed

    def forward(self, label_embeddings: torch.Tensor) -> torch.Tensor:
        return self.count_embed(label_embeddings, 1)[0]


class _Classifier(torch.nn.Module):
    def __init__(self, classifier: torch.nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        return self.classifier(hidden_state)


def unsupported(model: Any) -> list[str]:
    """Why the gliner2-onnx runtime cannot run this model (empty when it can): it implements the span architecture's
    entity decoding with first-subword pooling, the SpanMarkerV0 head and gliner2's whitespace word splitter."""
    reasons = []
    architecture = getattr(model, "architecture", getattr(model.config, "architecture", "span"))
    if architecture != "span":
        return [
            f"the {architecture} architecture: gliner2-onnx implements the span architecture only (a boundary "
            "model decodes with its own start/end heads and proposal pipeline, which the runtime does not have)"
        ]
    pooling = getattr(model.config, "token_pooling", "first")
    if pooling != "first":
        reasons.append(f"token_pooling {pooling!r}: gliner2-onnx pools each word by its first subword only")
    marker = getattr(getattr(model, "span_rep", None), "span_rep_layer", None)
    if marker is None or not all(hasattr(marker, name) for name in ("project_start", "project_end", "out_project")):
        reasons.append("a span head other than gliner2's SpanMarkerV0 (markerV0), the only one the runtime scores")
    splitter = type(getattr(model.processor, "word_splitter", None)).__name__
    if splitter != "WhitespaceTokenSplitter":
        reasons.append(f"word splitter {splitter}: gliner2-onnx splits words with gliner2's whitespace pattern only")
    tokenizer = model.processor.tokenizer
    missing = [token for token in RUNTIME_SPECIAL_TOKENS if token not in tokenizer.get_vocab()]
    if missing:
        reasons.append(f"the tokenizer lacks gliner2's special tokens {missing}")
    return reasons


def model_facts(model: Any) -> dict[str, Any]:
    """What gliner2_config.json and the export's metadata record about the model."""
    tokenizer = model.processor.tokenizer
    vocab = tokenizer.get_vocab()
    special = {token: int(vocab[token]) for token in (*RUNTIME_SPECIAL_TOKENS, "[C]", "[R]") if token in vocab}
    return {
        "max_width": int(model.max_width),
        "special_tokens": special,
        "hidden_size": int(model.hidden_size),
        "counting_layer": str(getattr(model.config, "counting_layer", "")),
        "encoder": type(model.encoder).__name__,
    }


def graph_specs(model: Any) -> list[GraphSpec]:
    """The four graphs of a span model (in eval mode), with small example inputs for tracing."""
    hidden = int(model.hidden_size)
    ids = torch.tensor([[int(model.processor.tokenizer.convert_tokens_to_ids("[P]"))] * 6], dtype=torch.long)
    positions = torch.tensor([[0, 1, 2, 3, 4]], dtype=torch.long)
    states = torch.zeros(1, 6, hidden)
    labels = torch.zeros(3, hidden)
    return [
        GraphSpec(
            "encoder",
            _Encoder(model.encoder),
            (ids, torch.ones_like(ids)),
            ("input_ids", "attention_mask"),
            ("hidden_states",),
            {name: {0: "batch", 1: "tokens"} for name in ("input_ids", "attention_mask", "hidden_states")},
        ),
        GraphSpec(
            "span_rep",
            _SpanRep(model.span_rep.span_rep_layer),
            (states, positions, positions),
            ("hidden_states", "span_start_idx", "span_end_idx"),
            ("span_representations",),
            {
                "hidden_states": {0: "batch", 1: "tokens"},
                "span_start_idx": {0: "batch", 1: "spans"},
                "span_end_idx": {0: "batch", 1: "spans"},
                "span_representations": {0: "batch", 1: "spans"},
            },
        ),
        GraphSpec(
            "count_embed",
            _CountEmbed(model.count_embed),
            (labels,),
            ("label_embeddings",),
            ("label_queries",),
            {"label_embeddings": {0: "labels"}, "label_queries": {0: "labels"}},
        ),
        GraphSpec(
            "classifier",
            _Classifier(model.classifier),
            (labels,),
            ("hidden_state",),
            ("logits",),
            {"hidden_state": {0: "labels"}, "logits": {0: "labels"}},
        ),
    ]
