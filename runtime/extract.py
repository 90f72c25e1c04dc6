"""Resumable batched extraction over a JSONL file: a job of record chunks, each computed once into its own part
file, and the output committed atomically from the parts. The Prefect-free core of ``prefect-gliner2 extract`` and
the ``gliner2-extract`` flow.

    <out folder>/.<out name>.extract/      the job's work directory (next to the output, on the same storage)
        job.json                           what the job is (input fingerprint, model, thresholds, schema,
                                           settings, a nonce) and, once the output is committed, its summary
        part-000003.jsonl                  chunk 3's output lines (written atomically)
        part-000003.json                   chunk 3's record (written after its part: the chunk's commit)
    <out>                                  every part in order, published whole (``storage.atomic_file``)

A chunk whose record exists is never computed again, so a kill at any moment followed by the same command loses
no line and writes none twice; the output is published only when every chunk is done. An output line is
``{"line": N, "id": ..., "extraction": {...}}`` (``id`` when the record has one; ``"chunks": k`` when its text
was split into k windows); with an annotation ``output_format`` (Label Studio, spaCy, CoNLL...) the parts also carry
each text and the output is written in that format from them (``extract_formats``). A job with other inputs or
settings than the unfinished one in the work directory is refused (rerun with the same arguments, or delete the work
directory).

``runtime="onnx"`` extracts with a model's ONNX export instead (``runtime/onnx_extract.py``: the gliner2-onnx
runtime, one of the precisions whose parity gate passed), into the same lines; every record's schema is checked
against what that runtime covers while the input is read, before any extraction.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.extract_formats import check_output_format, write_output
from prefect_gliner2.runtime.extract_input import InputPlan, check_labels, read_chunk, scan_input
from prefect_gliner2.runtime.extract_model import Extractor, ModelRef, loaded_extractor, resolve_model
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.onnx_scope import RUNTIME_ONNX, RUNTIME_TORCH, RUNTIMES, check_schema
from prefect_gliner2.session_core.storage import absolute_uri, atomic_file, resolve, write_atomic
from prefect_gliner2.session_core.thresholds import (
    DEFAULT_THRESHOLD,
    THRESHOLDS_KEY,
    Thresholds,
    fixed,
    read_thresholds,
)

if TYPE_CHECKING:
    from prefect_gliner2.runtime.onnx_extract import OnnxExtractor

__all__ = ["ExtractJob", "ExtractSettings", "commit_output", "load_job", "prepare_job", "run_chunk", "run_job"]

JOB_FILE = "job.json"
JOB_FORMAT = 1
WORK_SUFFIX = ".extract"


@dataclass(frozen=True)
class ExtractSettings:
    """How to extract: labels for records without their own, an explicit threshold (None: the model's), texts per
    inference batch, records per chunk (the unit of resumption), gliner2's word window and overlap for long texts,
    the output's format (``jsonl``, or an annotation format: ``runtime.extract_formats``), the runtime (``torch``:
    gliner2 on the torch model; ``onnx``: the model's ONNX export) and, for ONNX, the precision (None: the export's
    first of fp32, int8, fp16; a job records the one it chose)."""

    labels: list[str] | None = None
    threshold: float | None = None
    batch_size: int = 8
    records_per_chunk: int = 256
    chunk_size: int = 384
    chunk_overlap: int = 64
    output_format: str = "jsonl"
    runtime: str = RUNTIME_TORCH
    precision: str | None = None

    def __post_init__(self) -> None:
        check_output_format(self.output_format)
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime must be one of {list(RUNTIMES)}, got {self.runtime!r}")
        if self.precision is not None and self.runtime != RUNTIME_ONNX:
            raise ConfigError(f"a precision ({self.precision!r}) applies to the onnx runtime only")
        for name in ("batch_size", "records_per_chunk", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.chunk_overlap, int) or not 0 <= self.chunk_overlap < self.chunk_size:
            raise ConfigError(f"chunk_overlap must be in [0, chunk_size={self.chunk_size}), got {self.chunk_overlap}")
        if self.labels is not None:
            check_labels(self.labels, "labels")
        if self.threshold is not None:
            fixed(self.threshold)  # a ConfigError outside [0, 1]


@dataclass(frozen=True)
class ExtractJob:
    """One extraction job, as its job.json records it; `key` changes with anything that changes an output line."""

    out: str
    work: str
    model: ModelRef
    thresholds: Thresholds
    threshold_source: str
    default_schema: dict[str, Any] | None
    settings: ExtractSettings
    input: InputPlan
    nonce: str
    committed: dict[str, Any] | None = field(default=None)

    @property
    def key(self) -> str:
        material = json.dumps([self.identity(), self.nonce], sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """Everything an output line depends on."""
        settings = asdict(self.settings)
        settings.pop("labels")  # in default_schema
        if settings["runtime"] == RUNTIME_TORCH:  # a torch job keeps the key it had before runtimes existed
            del settings["runtime"], settings["precision"]
        return {
            "format": JOB_FORMAT,
            "input": self.input.fingerprint,
            "records_per_chunk": self.input.records_per_chunk,
            "model": self.model.identity,
            "thresholds": self.thresholds.to_dict(),
            "default_schema": self.default_schema,
            "settings": settings,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "identity": self.identity(),
            "nonce": self.nonce,
            "out": self.out,
            "model": asdict(self.model),
            "threshold_source": self.threshold_source,
            "settings": asdict(self.settings),
            "input": self.input.to_dict(),
            "committed": self.committed,
        }

    @classmethod
    def from_dict(cls, work: str, data: Mapping[str, Any]) -> ExtractJob:
        identity = data["identity"]
        return cls(
            out=str(data["out"]),
            work=work,
            model=ModelRef(**data["model"]),
            thresholds=Thresholds.from_dict(identity["thresholds"]),
            threshold_source=str(data["threshold_source"]),
            default_schema=identity["default_schema"],
            settings=ExtractSettings(**data["settings"]),
            input=InputPlan.from_dict(data["input"]),
            nonce=str(data["nonce"]),
            committed=data.get("committed"),
        )

    def part(self, index: int, suffix: str = ".jsonl") -> str:
        return f"{self.work}/part-{index:06d}{suffix}"

    def extractor(self) -> Extractor | OnnxExtractor:
        if self.settings.runtime == RUNTIME_ONNX:
            from prefect_gliner2.runtime.onnx_extract import loaded_onnx_extractor
            from prefect_gliner2.runtime.resources import default_cpu_threads

            return loaded_onnx_extractor(
                self.model,
                str(self.settings.precision),
                per_label=self.thresholds,
                chunk_size=self.settings.chunk_size,
                chunk_overlap=self.settings.chunk_overlap,
                spans=self.settings.output_format != "jsonl",
                threads=default_cpu_threads(),  # one session per thread, texts on them at once (onnx_extract)
            )
        return loaded_extractor(
            self.model,
            threshold=self.thresholds.threshold,
            per_label=self.thresholds,
            batch_size=self.settings.batch_size,
            chunk_size=self.settings.chunk_size,
            chunk_overlap=self.settings.chunk_overlap,
            spans=self.settings.output_format != "jsonl",
        )


def model_version(ref: ModelRef) -> str:
    """How Label Studio names the model whose predictions these are: the reference, with its registry version."""
    return f"{ref.source}@{ref.version}" if ref.version and "@" not in ref.source else ref.source


def work_dir(out: str) -> str:
    """The job's work directory: a hidden sibling of the output."""
    parent, _, name = absolute_uri(out).rstrip("/").rpartition("/")
    return f"{parent}/.{name}{WORK_SUFFIX}"


def prepare_job(model: str, data: str, out: str, settings: ExtractSettings) -> ExtractJob:
    """Resolve the model (a registry reference pins its version), read its thresholds, check and index the input,
    then continue the unfinished job in the work directory or record a new one."""
    onnx = settings.runtime == RUNTIME_ONNX
    if onnx:
        from prefect_gliner2.runtime.onnx_model import choose_precision, resolve_onnx

        ref = resolve_onnx(model)
        settings = replace(settings, precision=choose_precision(ref, settings.precision))
    else:
        ref = resolve_model(model)
    thresholds, source = _thresholds(ref, settings.threshold)
    default_schema = {"entities": list(settings.labels)} if settings.labels else ref.trained_schema()
    if onnx and default_schema is not None:
        check_schema(thresholds.apply(default_schema), "the labels to extract")
    check = (lambda schema, where: check_schema(thresholds.apply(schema), where)) if onnx else None
    plan = scan_input(absolute_uri(data), settings.records_per_chunk, check=check)
    if plan.without_schema and default_schema is None:
        raise ConfigError(
            f"{plan.without_schema} record(s) of {data} carry no 'schema' or 'labels' (the first at line "
            f"{plan.first_without_schema}), no --labels were given and model {model!r} records no labels in its "
            "export.json; pass --labels person,organization (or labels=[...]) or give each record a 'labels' list"
        )
    job = ExtractJob(
        out=absolute_uri(out),
        work=work_dir(out),
        model=ref,
        thresholds=thresholds,
        threshold_source=source,
        default_schema=default_schema,
        settings=settings,
        input=plan,
        nonce=secrets.token_hex(8),
    )
    return _continue_or_record(job)


def _thresholds(ref: ModelRef, explicit: float | None) -> tuple[Thresholds, str]:
    if explicit is not None:
        return fixed(explicit), f"{explicit} (given explicitly)"
    recorded = _recorded_thresholds(ref)
    if recorded is None:
        return fixed(DEFAULT_THRESHOLD), f"{DEFAULT_THRESHOLD} (gliner2's default: the model records no thresholds)"
    per_label = sum(len(getattr(recorded, kind)) for kind in ("entities", "relations", "fields"))
    where = "recorded with the ONNX export" if "precisions" in ref.export_info else "from the model's export.json"
    return recorded, f"{recorded.threshold} and {per_label} per-label value(s), fitted ({where})"


def _recorded_thresholds(ref: ModelRef) -> Thresholds | None:
    """The thresholds the model records: its export.json's (an ONNX export's record carries them too)."""
    if not ref.export_info:
        return None
    recorded = ref.export_info.get(THRESHOLDS_KEY)
    if recorded is not None:
        return Thresholds.from_dict(recorded)
    return read_thresholds(ref.uri)


def _continue_or_record(job: ExtractJob) -> ExtractJob:
    fs, work = resolve(job.work)
    out_fs, out_path = resolve(job.out)
    marker = f"{work}/{JOB_FILE}"
    if fs.exists(marker):
        recorded = ExtractJob.from_dict(job.work, json.loads(fs.cat_file(marker)))
        changed = sorted(k for k, v in job.identity().items() if recorded.identity().get(k) != v)
        if recorded.out != job.out:
            changed.append("out")
        if changed and recorded.committed is not None and out_fs.exists(out_path):
            raise ConfigError(
                f"output {job.out} already exists (written with other {', '.join(changed)}); choose another output "
                "or delete it"
            )
        if changed:
            moved = (
                f" (it used {recorded.model.describe()}: a registry's CURRENT may have moved; name that version)"
                if "model" in changed
                else ""
            )
            raise ConfigError(
                f"{job.work} holds an extraction into {job.out} with other {', '.join(changed)}{moved}; rerun with "
                f"the same arguments to finish it, or delete {job.work} (and {job.out}) to start over"
            )
        if recorded.committed is None or out_fs.exists(out_path):
            if recorded.committed is not None:
                _remove_parts(recorded)  # left by a kill between the commit and the clean-up
            return recorded
        fs.rm(work, recursive=True)  # the output was committed and then removed: extract again
    elif out_fs.exists(out_path):
        raise ConfigError(f"output {job.out} already exists; choose another output or delete it")
    fs.makedirs(work, exist_ok=True)
    write_atomic(fs, marker, json.dumps(job.to_dict(), indent=1).encode())
    return job


def load_job(work: str) -> ExtractJob:
    """The job recorded in a work directory (what a chunk task reads)."""
    fs, path = resolve(work)
    return ExtractJob.from_dict(work, json.loads(fs.cat_file(f"{path}/{JOB_FILE}")))


def run_chunk(job: ExtractJob, index: int) -> dict[str, Any]:
    """Compute chunk `index` into its part file, unless its record says it is done; returns the record (with
    ``reused`` True when it was already done)."""
    fs, _ = resolve(job.work)
    done = job.part(index, ".json")
    if fs.exists(done):
        return {**json.loads(fs.cat_file(done)), "reused": True}
    faults.hit("chunk", index)
    start = time.perf_counter()
    records = read_chunk(job.input, index)
    schemas = [record.schema or job.default_schema or {} for record in records]
    results, chunks = job.extractor().extract([record.text for record in records], schemas)
    lines = []
    for record, result, count in zip(records, results, chunks, strict=True):
        line: dict[str, Any] = {"line": record.line}
        if record.id is not None:
            line["id"] = record.id
        line["extraction"] = result
        if job.settings.output_format != "jsonl":
            line["text"] = record.text  # the format writer needs it (runtime.extract_formats)
        if count > 1:
            line["chunks"] = count
        lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    write_atomic(fs, resolve(job.part(index))[1], "".join(lines).encode())
    info = {
        "index": index,
        "records": len(records),
        "texts_chunked": sum(1 for count in chunks if count > 1),
        "text_chunks": sum(count for count in chunks if count > 1),
        "seconds": round(time.perf_counter() - start, 4),
    }
    write_atomic(fs, resolve(done)[1], json.dumps(info).encode())
    return {**info, "reused": False}


def commit_output(job: ExtractJob, chunk_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Publish every part, in order, as the output (atomically), record the summary in job.json, drop the parts."""
    fs, _ = resolve(job.work)
    missing = [i for i in range(job.input.chunks) if not fs.exists(resolve(job.part(i, ".json"))[1])]
    if missing:
        raise ConfigError(
            f"{len(missing)} chunk(s) of {job.work} are not done (the first: {missing[0]}); run the job again"
        )
    if job.settings.output_format == "jsonl":
        with atomic_file(job.out) as handle:
            for index in range(job.input.chunks):
                with fs.open(resolve(job.part(index))[1], "rb") as part:
                    shutil.copyfileobj(part, handle, 1 << 20)
    else:
        lines = [line for i in range(job.input.chunks) for line in fs.cat_file(resolve(job.part(i))[1]).splitlines()]
        write_output(lines, job.out, job.settings.output_format, model_version(job.model))
    summary = summarize(job, chunk_records)
    committed = replace(job, committed=summary)
    write_atomic(fs, resolve(f"{job.work}/{JOB_FILE}")[1], json.dumps(committed.to_dict(), indent=1).encode())
    _remove_parts(job)
    return summary


def summarize(job: ExtractJob, chunk_records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "out": job.out,
        "records": sum(int(r["records"]) for r in chunk_records),
        "chunks": job.input.chunks,
        "computed": sum(1 for r in chunk_records if not r.get("reused")),
        "reused": sum(1 for r in chunk_records if r.get("reused")),
        "texts_chunked": sum(int(r["texts_chunked"]) for r in chunk_records),
        "text_chunks": sum(int(r["text_chunks"]) for r in chunk_records),
        "model": job.model.source,
        "model_uri": job.model.uri,
        "version": job.model.version,
        "threshold": job.thresholds.threshold,
        "threshold_source": job.threshold_source,
        "chunk_size": job.settings.chunk_size,
        "chunk_overlap": job.settings.chunk_overlap,
        "format": job.settings.output_format,
        "runtime": job.settings.runtime,
        "precision": job.settings.precision,
    }


def _remove_parts(job: ExtractJob) -> None:
    fs, work = resolve(job.work)
    for entry in fs.ls(work, detail=False):
        if entry.rstrip("/").rsplit("/", 1)[-1].startswith("part-"):
            fs.rm(entry)


def run_job(job: ExtractJob, progress: Callable[[dict[str, Any], int], None] | None = None) -> dict[str, Any]:
    """Every chunk in order (done ones reused), then the commit; `progress(chunk record, records done)` after
    each chunk. A job whose output is already committed returns its summary."""
    if job.committed is not None:
        return {**job.committed, "already_committed": True}
    records_done = 0
    chunk_records = []
    for index in range(job.input.chunks):
        info = run_chunk(job, index)
        chunk_records.append(info)
        records_done += int(info["records"])
        if progress is not None:
            progress(info, records_done)
    return commit_output(job, chunk_records)
