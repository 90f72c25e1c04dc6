"""The chaos engine: SIGKILL the training flow at seeded random moments, resume, and compare bit for bit.

Used by tests/test_chaos.py (quick mode, storage faults) and by the benchmark CLI bench/chaos.py (``run_chaos``,
``format_report``, ``prefect_server``).

For each case an uninterrupted flow run is the reference. A second run key is then crashed repeatedly: every
crashed attempt is a fresh interpreter running ``train_flow`` that is SIGKILLed at a moment chosen by the seed --
paused by a fault plan (``prefect_gliner2.runtime.faults``, installed in that interpreter) mid-window (between the
micro-batches of one update), while a checkpoint's files are written but not committed, during validation, during
export, after a seeded random delay (purely time-based), or by killing the session worker alone (the flow must
recover by itself). With background checkpoints also while a checkpoint's background write is paused and training
has gone on past it (``background-write``), and by the worker killing itself in its background write
(``background-worker``). Each next attempt is a new flow run with the same run key. The final export (every tensor of
every ``*.safetensors``) and the train/eval histories of the final checkpoint must equal the reference's bitwise;
differing bits are counted by XOR + popcount.

Storage faults (``--storage-faults``, on by default in the full mode) damage the newest committed checkpoint
(truncate, edit one byte, delete a file), make a checkpoint write fail (an injected failure after the files are
written, and a real ``EFBIG`` from ``RLIMIT_FSIZE``), and record what the product does (support/chaos_storage.py).

``prefect_server(None)`` starts a throwaway local Prefect server (support.prefect_harness).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect_gliner2.runtime.faults import Fault, FaultPlan, install, uninstall

from support.config import training_config
from support.flow import export_tensors, make_inputs, merge_params
from support.prefect_harness import local_prefect_server
from support.processes import kill9, pid_gone

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

THREADS = 1
CHECKPOINT_EVERY = 2
# 12 records, batch 2, accumulation 2, 2 epochs: 12 batches; updates after odd batches; checkpoints after batches
# 3, 5 (epoch end), 7 and 11; validations after 5 and 11; the export happens at batch 11.
MID_WINDOW = (0, 2, 4, 6, 8, 10)  # batch i+1 not trained yet while batch i's gradients are pending
CHECKPOINTS = (3, 5, 7, 11)
VALIDATIONS = (5, 11)
LAST = 11
# "span" runs the default execution (automatic grain, operations sent ahead); "boundary" one task per batch, nothing
# sent ahead; the others pin pipelining (one also groups batches per task), so kills also land while pre-sent
# operations are in flight.
CASES: dict[str, dict[str, Any]] = {
    "boundary": {
        "model": "tiny:boundary",
        "lora": False,
        "flow": {"execution": {"batches_per_task": 1, "pipeline_depth": 0}},
    },
    "span-lora": {"model": "tiny:span", "lora": True, "flow": {"execution": {"pipeline_depth": 2}}},
    "span": {"model": "tiny:span", "lora": False, "flow": {}},
    "boundary-lora": {
        "model": "tiny:boundary",
        "lora": True,
        "flow": {"execution": {"batches_per_task": 3, "pipeline_depth": 2}},
    },
    # background checkpoints: kills while a checkpoint is written in the worker's background and training goes on
    "span-background": {
        "model": "tiny:span",
        "lora": False,
        "flow": {"checkpointing": {"background_checkpoints": True}, "execution": {"pipeline_depth": 1}},
    },
}
QUICK_PLAN = {"boundary": ["mid-window"], "span-lora": ["worker"]}
#: The quick kills of cases the default quick run leaves out (run them with ``cases=[...]``).
QUICK_ON_REQUEST = {"span-background": ["background-write", "background-worker"]}
COMPARED_SUMMARY = (
    "total_steps",
    "total_epochs",
    "best_metric",
    "best_step",
    "label",
    "stopped_early",
    "batch_count",
    "fingerprint",
    "content_address",
)


# ---- results -----------------------------------------------------------------------------------------------


@dataclass
class Kill:
    case: str
    kind: str
    point: str
    outcome: str  # "killed", "finished before the kill", "not reached"
    cursor_after: int | None
    worker_gone: bool | None = None
    resume_s: float | None = None  # new flow run -> first batch trained from the restored checkpoint


@dataclass
class CaseResult:
    case: str
    kills: list[Kill] = field(default_factory=list)
    resumes: int = 0
    resume_seconds: list[float] = field(default_factory=list)
    reference_seconds: float = 0.0
    differing_bits: int = 0
    differing_tensors: int = 0
    tensors: int = 0
    history_equal: bool = False
    summary_equal: bool = False


# ---- running flows -----------------------------------------------------------------------------------------


def spawn(
    params: dict[str, Any], plan: FaultPlan | None, api_url: str, *, fsize_limit: int | None = None
) -> subprocess.Popen[str]:
    """Run train_flow in a fresh interpreter (``python -m support.flow_child``) against the API at `api_url`, with
    the fault plan `plan` installed there."""
    pythonpath = os.pathsep.join([str(TESTS), str(ROOT)])
    full_env = dict(os.environ, PYTHONPATH=pythonpath, PREFECT_API_URL=api_url, OMP_NUM_THREADS="1")

    def limit() -> None:  # a real failing write: EFBIG past `fsize_limit` bytes in this process and its worker
        if fsize_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

    return subprocess.Popen(
        [sys.executable, "-m", "support.flow_child", json.dumps(params), plan.to_json() if plan is not None else ""],
        cwd=str(ROOT),
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit if fsize_limit is not None else None,
    )


def run_in_process(params: dict[str, Any], plan: FaultPlan | None = None) -> dict[str, Any]:
    """train_flow in this process, with `plan` installed for its duration."""
    from prefect_gliner2.flows.train import train_flow

    install(plan)
    try:
        return dict(train_flow(**params))
    finally:
        uninstall()


def wait_for(markers: Path, name: str, process: subprocess.Popen[str], timeout: float = 120) -> int | None:
    """The pid written at marker `name`, or None when the process exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = markers / name
        if path.exists():
            return int(path.read_text())
        if process.poll() is not None:
            return None
        time.sleep(0.02)
    raise TimeoutError(f"marker {name} did not appear within {timeout} s")


def read_cursor(run: Path) -> dict[str, Any] | None:
    path = run / "cursor.json"
    return json.loads(path.read_text()) if path.exists() else None


# ---- one crash -----------------------------------------------------------------------------------------------


def crash(
    kind: str,
    params: dict[str, Any],
    run: Path,
    work: Path,
    api_url: str,
    rng: random.Random,
    estimate: float,
    case: str,
    prefer: int | None = None,
) -> Kill | None:
    """One crashed attempt of kind `kind` at a seeded random eligible moment (`prefer`, the index drawn in advance,
    when it is still ahead of the durable cursor); None when nothing is eligible."""

    def choice(options: list[int]) -> int:
        return prefer if prefer in options else rng.choice(options)

    cursor = (read_cursor(run) or {}).get("cursor", 0)
    markers = Path(tempfile.mkdtemp(prefix="markers-", dir=work))
    planned: list[Fault] = []
    then: str | None = None  # a further marker to wait for before the kill
    if kind == "mid-window":
        choices = [i + 1 for i in MID_WINDOW if i + 1 > cursor]  # paused before batch i+1: batch i is pending
        point = ("batch", choice(choices)) if choices else None
    elif kind == "checkpoint-write":
        point = ("checkpoint-write", choice([i for i in CHECKPOINTS if i >= cursor] or [-1]))
    elif kind == "background-write":  # the write pauses; the flow dies once training went on past it (batch i+1)
        point = ("checkpoint-write", choice([i for i in CHECKPOINTS if cursor <= i < LAST] or [-1]))
        then = f"batch-{point[1] + 1}"
    elif kind == "background-worker":  # the worker dies in its background write; the flow recovers, dies at export
        choices = [i for i in CHECKPOINTS if i >= cursor]
        point = ("export-write", LAST)
        if choices:
            planned.append(Fault.kill("checkpoint-write", choice(choices), once=str(markers / "died")))
        else:
            kind = "export"
    elif kind == "validate":
        point = ("validate", choice([i for i in VALIDATIONS if i >= cursor] or [-1]))
    elif kind == "export":
        point = ("export-write", LAST)
    elif kind == "worker":  # the worker SIGKILLs itself at batch i; the flow recovers and is killed at export
        choices = [i for i in range(cursor, LAST + 1)]
        point = ("export-write", LAST)
        if choices:
            planned.append(Fault.kill("batch", choice(choices), once=str(markers / "died")))
        else:
            kind = "export"  # training is done: only the export is left to interrupt
    elif kind == "time":
        point = ("time", 0)
    else:
        raise ValueError(f"unknown kill kind {kind!r}")
    if point is None or point[1] < 0:
        return None
    name, index = point
    if name != "time":
        planned.append(Fault.pause(name, index, 120))
    launched = time.time()
    process = spawn(params, FaultPlan(tuple(planned), markers=str(markers)), api_url)
    worker: int | None = None
    try:
        if name == "time":
            if wait_for(markers, f"batch-{cursor}", process) is not None:  # the restored worker is training
                delay = rng.uniform(0.0, estimate)
                time.sleep(delay)
                name, index = "time", round(delay, 3)  # type: ignore[assignment]
                reached = sorted(markers.iterdir(), key=lambda p: p.stat().st_mtime_ns)
                worker = int(reached[-1].read_text()) if reached else None
                outcome = "killed" if process.poll() is None else "finished before the kill"
            else:
                outcome = "finished before the kill"
        else:
            worker = wait_for(markers, f"{name}-{index}", process)
            if worker is not None and then is not None and wait_for(markers, then, process) is None:
                worker = None
            outcome = "killed" if worker is not None else "not reached"
    finally:
        output = kill9(process)
    if outcome == "not reached" and "Traceback" in output:
        raise RuntimeError(f"crashed attempt {kind} at {name}:{index} failed on its own:\n{output[-4000:]}")
    gone = pid_gone(worker) if worker is not None and outcome == "killed" else None
    if kind in ("worker", "background-worker") and not (markers / "died").exists():
        outcome = "not reached"
    return Kill(
        case,
        kind,
        f"{name}:{index}",
        outcome,
        (read_cursor(run) or {}).get("cursor"),
        gone,
        time_to_first_batch(markers, cursor, launched) if cursor else None,
    )


def time_to_first_batch(markers: Path, cursor: int, launched: float) -> float | None:
    """Seconds from launching a resumed flow run until its restored worker reached batch `cursor` (from markers)."""
    path = markers / f"batch-{cursor}"
    return path.stat().st_mtime - launched if path.exists() else None


# ---- comparison ----------------------------------------------------------------------------------------------


def differing_bits(a: Any, b: Any) -> int:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return max(a.numel() * a.element_size(), b.numel() * b.element_size()) * 8
    left = a.contiguous().view(-1).view(torch.uint8)
    right = b.contiguous().view(-1).view(torch.uint8)
    xor = torch.bitwise_xor(left, right)
    return int(sum(bin(v).count("1") for v in xor[xor != 0].tolist()))


def compare_exports(a: str, b: str) -> tuple[int, int, int]:
    """(tensors, differing tensors, differing bits); a missing tensor counts all its bits."""
    left, right = export_tensors(a), export_tensors(b)
    bits = differing = 0
    for name in sorted(set(left) | set(right)):
        if name not in left or name not in right:
            tensor = left[name] if name in left else right[name]
            bits += tensor.numel() * tensor.element_size() * 8
            differing += 1
            continue
        found = differing_bits(left[name], right[name])
        bits += found
        differing += bool(found)
    return len(left), differing, bits


def final_histories(run: Path) -> dict[str, Any]:
    from prefect_gliner2.session_core.checkpoint import read_checkpoint

    cursor = read_cursor(run)
    assert cursor is not None, f"{run} has no durable cursor"
    state = json.loads(read_checkpoint(str(run / "checkpoints" / cursor["checkpoint"])).require("managed.json"))
    return {k: state[k] for k in ("train_metrics_history", "eval_metrics_history")}


# ---- cases ---------------------------------------------------------------------------------------------------


def draw_kills(rng: random.Random, *, background: bool = False) -> list[tuple[str, int | None]]:
    """Every kill kind at a seeded random index, in the order the run reaches them: time-based first (from
    scratch), the worker kill last (its run is then killed during the export). With `background` (checkpoints
    written in the background), a kill during a background write joins them and the worker dies in one."""
    drawn = [
        ("mid-window", rng.choice(MID_WINDOW) + 1),
        ("checkpoint-write", rng.choice(CHECKPOINTS)),
        ("validate", rng.choice(VALIDATIONS)),
    ]
    if background:
        drawn.append(("background-write", rng.choice(CHECKPOINTS[:-1])))
    # batch j pauses before training j
    rank = {"mid-window": -0.5, "validate": 0.0, "checkpoint-write": 0.25, "background-write": 0.3}
    ordered = sorted(drawn, key=lambda kill: kill[1] + rank[kill[0]])
    if background:
        return [("time", None), *ordered, ("background-worker", rng.choice(CHECKPOINTS))]
    return [("time", None), *ordered, ("worker", rng.randrange(ordered[-1][1], LAST + 1))]


def run_case(
    case: str,
    kinds: list[str] | list[tuple[str, int | None]],
    root: Path,
    inputs: dict[str, str],
    api_url: str,
    rng: random.Random,
) -> CaseResult:
    spec = CASES[case]
    storage = root / "runs"
    base = dict(
        model=spec["model"],
        train_data=inputs["train"],
        valid_data=inputs["valid"],
        config=training_config(use_lora=bool(spec["lora"])),
        storage=str(storage),
        checkpointing={"checkpoint_every": CHECKPOINT_EVERY},
        execution={"cpu_threads": THREADS},
    )
    base = merge_params(base, spec["flow"])
    result = CaseResult(case)
    root.mkdir(parents=True, exist_ok=True)
    markers = Path(tempfile.mkdtemp(prefix="markers-reference-", dir=root))
    started = time.perf_counter()
    reference = run_in_process({**base, "run_key": f"{case}-reference"}, FaultPlan(markers=str(markers)))
    result.reference_seconds = time.perf_counter() - started
    # the time-based kill lands somewhere in the first half of the training span (from its first batch)
    training_seconds = 0.5 * ((markers / f"batch-{LAST}").stat().st_mtime - (markers / "batch-0").stat().st_mtime)
    params = {**base, "run_key": f"{case}-chaos"}
    run = storage / f"{case}-chaos"
    for item in kinds:
        kind, prefer = item if isinstance(item, tuple) else (item, None)
        kill = crash(kind, params, run, root, api_url, rng, training_seconds, case, prefer)
        if kill is not None:
            result.kills.append(kill)
    cursor = (read_cursor(run) or {}).get("cursor", 0)
    markers = Path(tempfile.mkdtemp(prefix="markers-final-", dir=root))
    launched = time.time()
    summary = run_in_process(params, FaultPlan(markers=str(markers)))
    final = time_to_first_batch(markers, cursor, launched) if cursor else None
    result.resume_seconds = [k.resume_s for k in result.kills if k.resume_s is not None] + ([final] if final else [])
    result.resumes = sum(1 for k in result.kills if k.outcome == "killed")
    result.tensors, result.differing_tensors, result.differing_bits = compare_exports(
        summary["export"], reference["export"]
    )
    result.history_equal = final_histories(run) == final_histories(storage / f"{case}-reference")
    result.summary_equal = all(summary.get(k) == reference.get(k) for k in COMPARED_SUMMARY)
    return result


# ---- report --------------------------------------------------------------------------------------------------


def run_chaos(
    *, quick: bool, seed: int, api_url: str, work: Path, cases: list[str] | None = None, faults: bool | None = None
) -> dict[str, Any]:
    from support import chaos_storage  # it builds on this module's helpers

    rng = random.Random(seed)
    inputs = make_inputs(work / "data")
    plan: dict[str, Any]
    if quick:
        plan = {k: list(v) for k, v in QUICK_PLAN.items()}
    else:
        plan = {case: draw_kills(rng, background=_background(case)) for case in CASES}
    if cases:
        extra = QUICK_ON_REQUEST if quick else {}
        plan = {
            case: plan.get(case) or extra.get(case) or draw_kills(rng, background=_background(case)) for case in cases
        }
    results = [run_case(case, kinds, work / case, inputs, api_url, rng) for case, kinds in plan.items()]
    fault_results = (
        chaos_storage.storage_faults(work / "faults", inputs, api_url)
        if (faults if faults is not None else not quick)
        else []
    )
    kills = [k for r in results for k in r.kills]
    resumes = [s for r in results for s in r.resume_seconds]
    return {
        "seed": seed,
        "quick": quick,
        "kill_points_tried": len(kills),
        "killed": sum(k.outcome == "killed" for k in kills),
        "resumed": sum(r.resumes for r in results),
        "differing_bits": sum(r.differing_bits for r in results),
        "histories_equal": all(r.history_equal for r in results),
        "summaries_equal": all(r.summary_equal for r in results),
        "mean_resume_s": sum(resumes) / len(resumes) if resumes else None,
        "resume_samples": len(resumes),
        "mean_reference_s": sum(r.reference_seconds for r in results) / len(results) if results else None,
        "cases": [asdict(r) for r in results],
        "storage_faults": [asdict(f) for f in fault_results],
    }


def _background(case: str) -> bool:
    return bool(CASES[case]["flow"].get("checkpointing", {}).get("background_checkpoints"))


def format_report(report: dict[str, Any]) -> str:
    lines = [f"chaos (seed {report['seed']}{', quick' if report['quick'] else ''})"]
    for case in report["cases"]:
        for kill in case["kills"]:
            lines.append(
                f"  {case['case']:<14} {kill['kind']:<17} {kill['point']:<22} {kill['outcome']:<26} "
                f"cursor after {kill['cursor_after']}"
                + ("" if kill["resume_s"] is None else f", resumed in {kill['resume_s']:.2f} s")
                + ("" if kill["worker_gone"] is None else f", worker gone {kill['worker_gone']}")
            )
        lines.append(
            f"  {case['case']:<14} final: {case['tensors']} tensors, {case['differing_tensors']} differ, "
            f"{case['differing_bits']} differing bits; history equal {case['history_equal']}, "
            f"summary equal {case['summary_equal']}"
        )
    mean = report["mean_resume_s"]
    lines += [
        f"kill points tried: {report['kill_points_tried']} (killed {report['killed']})",
        f"resumed: {report['resumed']}",
        f"differing bits: {report['differing_bits']}",
        f"histories equal: {report['histories_equal']}",
        (
            f"mean resume time: {mean:.2f} s over {report['resume_samples']} resumes (new flow run -> first batch "
            f"trained from the restored checkpoint; uninterrupted run {report['mean_reference_s']:.2f} s)"
        )
        if mean
        else "mean resume time: n/a",
    ]
    for fault in report["storage_faults"]:
        lines.append(
            f"storage fault: {fault['fault']}: detected {fault['detected']}, continued exactly "
            f"{fault['continued_exactly']}; {fault['error']} -- {fault['note']}"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def prefect_server(api_url: str | None) -> Iterator[str]:
    """The Prefect API at `api_url`, or a throwaway local server (heartbeats off) for the duration."""
    if api_url:
        yield api_url
        return
    with local_prefect_server() as url:
        yield url
