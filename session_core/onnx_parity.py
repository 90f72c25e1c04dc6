"""The parity gate of an ONNX export: the exported graphs against the torch model they came from, on the same
records with the same schemas, label order and thresholds; its figures and its verdict (torch-free).

Figures (``ParityReport``): span agreement (the spans, as (label, start, end), that both extract over those either
extracts), the largest confidence difference on the spans both extract, the records whose output lines are equal,
and each side's F1 against the gold records (micro, macro and per label; the F1 difference is ONNX minus torch).

Tolerance, by precision:
- ``fp32``: the same extractions (every span of either side extracted by both, every record's line equal) and no
  confidence further than ``SCORE_TOLERANCE`` from the torch model's;
- ``int8`` and ``fp16`` (lossy on purpose): micro F1 within ``F1_TOLERANCE`` of the torch model's.
An export outside its tolerance is refused (:class:`ParityError`) with the figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect_gliner2.session_core.errors import ParityError
from prefect_gliner2.session_core.onnx_payload import plain_payload, scored_spans
from prefect_gliner2.session_core.scoring import DatasetSchema, score_records

__all__ = ["F1_TOLERANCE", "SCORE_TOLERANCE", "ParityReport", "check_parity", "compare_extractions"]

SCORE_TOLERANCE = 1e-4  # fp32: largest confidence difference accepted on a span both extract
F1_TOLERANCE = 0.01  # int8, fp16: largest micro F1 difference accepted


@dataclass(frozen=True)
class ParityReport:
    """The gate's figures for one precision, and whether they are within its tolerance."""

    precision: str
    records: int
    torch_spans: int
    onnx_spans: int
    agreeing_spans: int
    span_agreement: float
    max_score_diff: float
    equal_lines: int
    f1_torch: float
    f1_onnx: float
    f1_diff: float
    macro_f1_torch: float
    macro_f1_onnx: float
    per_label: list[dict[str, Any]] = field(default_factory=list)
    rule: str = ""
    passed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line of figures: ``int8: span agreement 0.981 (153 of 156), max |score diff| 0.0123, 58/60 lines
        equal, micro F1 0.9412 vs torch 0.9451 (-0.0039), macro 0.93 vs 0.94; rule ...: passed``."""
        return (
            f"{self.precision}: span agreement {self.span_agreement:.4f} ({self.agreeing_spans} of "
            f"{self.torch_spans + self.onnx_spans - self.agreeing_spans} spans), max |score diff| "
            f"{self.max_score_diff:.2e}, {self.equal_lines}/{self.records} lines equal, micro F1 {self.f1_onnx:.4f} "
            f"vs torch {self.f1_torch:.4f} ({self.f1_diff:+.4f}), macro F1 {self.macro_f1_onnx:.4f} vs "
            f"{self.macro_f1_torch:.4f}; rule: {self.rule}: {'passed' if self.passed else 'REFUSED'}"
        )


def compare_extractions(
    precision: str,
    gold: Sequence[Mapping[str, Any]],
    torch_detailed: Sequence[Mapping[str, Any]],
    onnx_detailed: Sequence[Mapping[str, Any]],
) -> ParityReport:
    """The figures of one precision: both sides' detailed payloads (confidences and offsets) for the same records,
    scored against the `gold` outputs, and the verdict of the precision's rule."""
    if not len(gold) == len(torch_detailed) == len(onnx_detailed):
        raise ValueError(f"{len(gold)} gold records, {len(torch_detailed)} torch and {len(onnx_detailed)} ONNX results")
    torch_total = onnx_total = agreeing = equal = 0
    max_diff = 0.0
    for torch_result, onnx_result in zip(torch_detailed, onnx_detailed, strict=True):
        expected, got = scored_spans(torch_result), scored_spans(onnx_result)
        both = expected.keys() & got.keys()
        torch_total, onnx_total, agreeing = torch_total + len(expected), onnx_total + len(got), agreeing + len(both)
        max_diff = max([max_diff, *(abs(expected[key] - got[key]) for key in both)])
        equal += int(plain_payload(torch_result) == plain_payload(onnx_result))
    union = torch_total + onnx_total - agreeing
    dataset = DatasetSchema.of(gold)
    torch_report = score_records(gold, [plain_payload(r) for r in torch_detailed], dataset)
    onnx_report = score_records(gold, [plain_payload(r) for r in onnx_detailed], dataset)
    torch_metrics, onnx_metrics = torch_report.metrics(), onnx_report.metrics()
    rows = {(row["kind"], row["label"]): row for row in onnx_report.rows()}
    per_label = [
        {
            "kind": row["kind"],
            "label": row["label"],
            "support": row["support"],
            "f1_torch": row["f1"],
            "f1_onnx": rows[(row["kind"], row["label"])]["f1"],
        }
        for row in torch_report.rows()
    ]
    f1_torch, f1_onnx = torch_metrics["eval_f1"], onnx_metrics["eval_f1"]
    lossless = precision == "fp32"
    if lossless:
        rule = f"same extractions and confidences within {SCORE_TOLERANCE:g}"
        passed = agreeing == torch_total == onnx_total and equal == len(gold) and max_diff <= SCORE_TOLERANCE
    else:
        rule = f"micro F1 within {F1_TOLERANCE:g} of torch's"
        passed = abs(f1_onnx - f1_torch) <= F1_TOLERANCE
    return ParityReport(
        precision=precision,
        records=len(gold),
        torch_spans=torch_total,
        onnx_spans=onnx_total,
        agreeing_spans=agreeing,
        span_agreement=agreeing / union if union else 1.0,
        max_score_diff=max_diff,
        equal_lines=equal,
        f1_torch=f1_torch,
        f1_onnx=f1_onnx,
        f1_diff=f1_onnx - f1_torch,
        macro_f1_torch=torch_metrics["eval_macro_f1"],
        macro_f1_onnx=onnx_metrics["eval_macro_f1"],
        per_label=per_label,
        rule=rule,
        passed=passed,
    )


def check_parity(reports: Sequence[ParityReport], where: str) -> None:
    """Refuse (ParityError, with every precision's figures) when any report is outside its tolerance."""
    failed = [report for report in reports if not report.passed]
    if failed:
        raise ParityError(
            f"ONNX export {where} refused by the parity gate: "
            + "; ".join(report.summary() for report in reports)
            + ". Nothing was published; export fewer precisions (--precision fp32) or check the model",
            reports=[report.to_dict() for report in reports],
        )
