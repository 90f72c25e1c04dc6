"""Benchmark report: run the plan, session, flow, chaos and real-size benchmarks side by side in one markdown table.

    python bench/run_all.py                    # ~95 minutes on a 2-core machine (flow ~30, sliced ~27, realsize ~19)
    python bench/run_all.py --skip realsize    # the small-model benchmarks only
    python bench/run_all.py --out /tmp/r.md --plan-sizes 10000,100000
    python bench/run_all.py --device cuda [--bf16] --skip plan,chaos --out cuda.md   # the GPU table (bench/gpu.sh)

Each benchmark runs as its own subprocess (bench/plan.py, bench/session.py, bench/flow.py: the flow against native
train() at three step times, runs of ~2 min, bench/flow_sliced.py: the same two taking turns of 0.5 s for 240 s
each, the cost per batch with the host's noise on both alike, bench/memory.py: updates with and without the worker's
memory setting, bench/checkpoint_cost.py, bench/chaos.py, bench/realsize.py: the gliner2-base shape, ~5 GB of RAM,
bench/cli_resume.py: the whole CLI run again after a crash at that shape vs a fresh start, ~5 minutes);
its figures are parsed from its --json output where it has one, else from its printed table. The report holds the
command, the machine (CPU model, cores, torch version), one table of ratios and every script's raw output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def machine(device: str = "cpu") -> str:
    gpu = ""
    if device.startswith("cuda"):
        gpu = (
            subprocess.run(
                [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            or "unknown GPU"
        )
        gpu = f"{gpu} (CUDA), "
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    torch = (
        subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return (
        f"{gpu}{cpu}, {cores} cores, Python {platform.python_version()}, torch {torch}, "
        f"{platform.system()} {platform.release()}"
    )


def run(script: str, *args: str, timeout: float) -> tuple[str, float, int]:
    command = [sys.executable, str(BENCH / script), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_LOGGING_LEVEL="WARNING")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + ("\n" + done.stderr[-2000:] if done.returncode else ""), done.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        output, code = f"{partial}\n(timed out after {timeout:.0f} s)", 124
    print(f"{script} {' '.join(args)}: exit {code} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return str(output), time.perf_counter() - started, code


Row = tuple[str, str, str]  # (measurement, ratio, detail)
FIVE_MINUTES = 300.0  # seconds of native training in the extrapolated run


def session_rows(rows: list[dict[str, Any]]) -> list[Row]:
    out: list[Row] = []
    for r in rows:
        name = f"{r['model']} {r['arch']}"
        out.append(
            (
                f"session vs native ExtractorTrainer.train() ({name})",
                f"{r['ratio']:.3f}",
                f"{r['session_s']:.3f} s vs {r['native_s']:.3f} s",
            )
        )
        out.append(
            (
                f"checkpoint save vs raw write of the same bytes ({name})",
                f"{r['save_s_per_gb'] / r['raw_write_s_per_gb']:.2f}",
                f"{r['save_s_per_gb']:.2f} vs {r['raw_write_s_per_gb']:.2f} s/GB, {r['checkpoint_bytes'] / 1e6:.1f} MB",
            )
        )
        out.append(
            (
                f"checkpoint load vs raw read of the same bytes ({name})",
                f"{r['load_s_per_gb'] / r['raw_read_s_per_gb']:.2f}",
                f"{r['load_s_per_gb']:.2f} vs {r['raw_read_s_per_gb']:.2f} s/GB",
            )
        )
    return out


def _median_range(values: list[float], fmt: str = ".3f") -> str:
    import statistics

    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def flow_rows(results: list[dict[str, Any]]) -> list[Row]:
    """bench/flow.py --json: the flow with default settings against native train(), per case."""
    out: list[Row] = []
    for r in results:
        f = r["figures"]
        name = f"{r['case']}, native step {r['step_s'] * 1000:.0f} ms, {r['batches']} batches"

        def both(key: str, scale: float = 1.0, fmt: str = ".1f", f: dict[str, Any] = f) -> str:
            flow, native = ([x * scale for x in f[key][v]] for v in ("flow", "native"))
            return f"{_median_range(flow, fmt)} vs {_median_range(native, fmt)}"

        out += [
            (
                f"flow (default settings) vs native ExtractorTrainer.train(), wall time ({name})",
                _median_range(f["ratio"]),
                f"{both('total')} s; {f['interval']['ratio']}; validation off in both; target <= 1.05",
            ),
            (
                f"flow vs native, cost per batch inside the run ({name})",
                _median_range(f["per_batch_ratio"]),
                f"{both('per_batch', 1e3)} ms per batch; {f['interval']['per_batch_ratio']}; fixed "
                f"{both('fixed')} s; target <= 1.05",
            ),
            (
                f"flow vs native, wall time of a 5-minute run from the measured costs ({name})",
                _median_range(f["minutes_ratio"]),
                f"{f['interval']['minutes_ratio']}; fixed and per-batch costs of each group over 5 minutes of "
                "native training (the runs themselves are shorter); target <= 1.05",
            ),
            (
                f"flow vs native, CPU seconds of every process ({name})",
                _median_range(f["cpu_ratio"]),
                f"{both('cpu')} s, the Prefect server's {both('server_cpu')} s (idle and up during both); "
                f"{f['interval']['cpu_ratio']}",
            ),
            (
                f"time to first batch, flow vs native ({name})",
                f"{_median_range(f['first']['flow'], '.1f')} s",
                f"native {_median_range(f['first']['native'], '.1f')} s (launch to the first batch trained; "
                "target: flow <= native + 4 s)",
            ),
            (
                f"last batch to exit, flow vs native ({name})",
                f"{_median_range(f['tail']['flow'], '.1f')} s",
                f"native {_median_range(f['tail']['native'], '.1f')} s (final checkpoint, export, report; target: "
                "flow <= 3 s)",
            ),
        ]
        if "orchestration_share" in f:
            share = f["orchestration_share"]  # percent
            out.append(
                (
                    f"orchestration CPU over the training's, first to last batch, % ({name})",
                    _median_range(share, ".2f"),
                    f"{f['interval']['orchestration_share']}; the flow process {_median_range(f['window_flow'], '.2f')}"
                    f" s + the Prefect server above its idle rate {_median_range(f['window_server_extra'], '.2f')} s"
                    f" against the worker's {_median_range(f['window_worker'], '.1f')} s of CPU; at most what it adds"
                    " per batch where the worker keeps the cores busy",
                )
            )
        if "retain_ratio" in f:
            retain = f"{_median_range(f['total']['native_retain'], '.1f')} s"
            out.append(
                (
                    f"flow vs native given the worker's memory setting (glibc thresholds raised), wall time ({name})",
                    _median_range(f["retain_ratio"]),
                    f"that native {retain}; {f['interval']['retain_ratio']}; per batch "
                    f"{_median_range(f['retain_per_batch_ratio'])} ({f['interval']['retain_per_batch_ratio']}); "
                    f"a 5-minute run {_median_range(f['retain_minutes_ratio'])} "
                    f"({f['interval']['retain_minutes_ratio']}): the flow's own cost, the allocator taken out",
                )
            )
    return out


def sliced_rows(results: list[dict[str, Any]]) -> list[Row]:
    """bench/flow_sliced.py --json: the flow's cost per batch against native train() in alternating time slices."""
    out: list[Row] = []
    for r in results:
        turns = f"{r['seconds']:.0f} s each in turns of {r['slice_s']:g} s"
        name = f"{r['case']}, native step {r['step_s'] * 1000:.0f} ms, {turns}"
        ratios = r["block_ratios"]
        sizes = [unit[0] for unit in r["flow_units"]]
        out.append(
            (
                f"flow vs native, cost per batch, alternating slices ({name})",
                f"{r['ratio']:.3f}",
                f"{r['flow_s'] * 1e3:.2f} vs {r['native_s'] * 1e3:.2f} ms per batch over the whole window; blocks "
                f"{_median_range(ratios)}, {r['interval']} over {len(ratios)} blocks; flow tasks of "
                f"{_median_range(sizes, '.0f')} batches; target <= 1.05",
            )
        )
    return out


def five_minute_rows(flows: list[dict[str, Any]], sliced: list[dict[str, Any]]) -> list[Row]:
    """A 5-minute run's wall-time ratio from bench/flow.py's fixed costs (start-up to exit, medians) and
    bench/flow_sliced.py's cost per batch (the ratio measured in alternating slices, with its interval)."""
    import statistics

    out: list[Row] = []
    for s in sliced:
        f = next((r["figures"] for r in flows if r["case"] == s["case"]), None)
        if f is None or s["block_mean"] is None:
            continue
        fixed_n, fixed_f = (statistics.median(f["fixed"][v]) for v in ("native", "flow"))
        mean, half = s["block_mean"], s["block_half_width"] or 0.0

        def wall(per_batch_ratio: float, fixed_n: float = fixed_n, fixed_f: float = fixed_f) -> float:
            return (fixed_f + FIVE_MINUTES * per_batch_ratio) / (fixed_n + FIVE_MINUTES)

        low, high = wall(mean - half), wall(mean + half)
        out.append(
            (
                f"flow vs native, wall time of a 5-minute run, fixed costs and sliced cost per batch ({s['case']})",
                f"{wall(s['ratio']):.3f}",
                f"fixed {fixed_f:.1f} vs {fixed_n:.1f} s (bench/flow.py, medians) + 300 s of native training at the "
                f"sliced ratio {s['ratio']:.3f}; {low:.3f}-{high:.3f} with the blocks' 95% interval; target <= 1.05",
            )
        )
    return out


def memory_rows(results: list[dict[str, Any]]) -> list[Row]:
    """bench/memory.py --json: training updates with glibc's defaults and with the worker's memory setting."""
    import statistics

    out: list[Row] = []
    for r in results:

        def both(key: str, scale: float, fmt: str, r: dict[str, Any] = r) -> str:
            default, retain = ([x[key] * scale for x in r["runs"][v]] for v in ("default", "retain"))
            return f"{_median_range(retain, fmt)} vs {_median_range(default, fmt)}"

        out.append(
            (
                f"training update with the worker's memory setting vs glibc's default ({r['shape']}: {r['model']})",
                _median_range(r["ratio"]),
                f"{both('step', 1e3, '.0f')} ms per update; page faults per update {both('faults', 1, '.0f')}; peak "
                f"RSS {both('peak', 1 / 2**20, '.0f')} MB; weights "
                f"{'bitwise equal' if r['same_bits'] else 'DIFFER'} ({len(r['ratio'])} pairs, "
                f"median step {statistics.median(x['step'] for x in r['runs']['default']):.2f} s)",
            )
        )
    return out


def plan_rows(output: str) -> list[Row]:
    out: list[Row] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 11 and parts[0].isdigit():
            out.append(
                (
                    f"plan + manifest per record, {int(parts[0]):,} records vs smallest size",
                    parts[9],
                    f"{parts[4]} s total, {parts[8]} us/record; memory per record x{parts[10]}",
                )
            )
    return out


def chaos_rows(report: dict[str, Any]) -> list[Row]:
    mean, reference = report.get("mean_resume_s"), report.get("mean_reference_s")
    rows: list[Row] = []
    if mean and reference:
        rows.append(
            (
                "resume after SIGKILL (new flow run -> first batch from the restored checkpoint) vs an "
                "uninterrupted run's wall time",
                f"{mean / reference:.2f}",
                f"{mean:.2f} s (mean of {report.get('resume_samples')}) vs {reference:.2f} s",
            )
        )
    rows.append(
        (
            "chaos: differing bits after kill + resume",
            str(report.get("differing_bits")),
            f"{report.get('killed')} kills of {report.get('kill_points_tried')} tried, {report.get('resumed')} "
            f"resumed, histories equal {report.get('histories_equal')}",
        )
    )
    for fault in report.get("storage_faults", []):
        rows.append(
            (
                f"storage fault: {fault['fault']}",
                "detected" if fault["detected"] else "NOT detected",
                f"continued exactly: {fault['continued_exactly']}; {fault['note']}",
            )
        )
    return rows


def _spread(row: dict[str, Any], key: str) -> str:
    """'median (min-max)' of a figure bench/realsize.py measured several times (its `key`_all list)."""
    values = row.get(f"{key}_all") or [row[key]]
    text = f"{row[key]:.2f}"
    return text if len(values) == 1 else f"{text} ({min(values):.2f}-{max(values):.2f})"


def _kept(row: dict[str, Any], prefix: str, ratio: str, batch: str | None = None) -> str:
    """The same resume keeping its checkpoint in the page cache (bench/realsize.py's comparison), when measured."""
    key = f"{prefix}_kept_{ratio}"
    if key not in row:
        return ""
    its_batch = f", its first batch {_spread(row, batch)} s" if batch else ""
    return f"; the same resume keeping the checkpoint in the page cache {_spread(row, key)}{its_batch}"


def checkpoint_cost_rows(result: dict[str, Any]) -> list[Row]:
    import statistics

    def ms(values: list[float]) -> str:
        ordered = sorted(v * 1000 for v in values)
        low, high = ordered[len(ordered) // 10], ordered[(len(ordered) * 9) // 10]
        return f"{statistics.median(ordered):.1f} ms ({low:.1f}-{high:.1f})"

    parts = "; ".join(f"{part} {ms(values)}" for part, values in result["parts"].items())
    unit = statistics.median(result["unit"])
    return [
        (
            f"fixed cost of one checkpoint, worker save to committed cursor ({result['model']}, "
            f"{result['bytes'] / 1e6:.1f} MB in {result['files']} files)",
            f"{unit * 1000:.1f} ms",
            f"median (10th-90th percentile) over {result['checkpoints']}: {ms(result['unit'])}; {parts}; raw write "
            f"+ fsync of the same bytes {ms(result['raw_one_file'])}; target < 50 ms",
        )
    ]


def realsize_rows(rows: list[dict[str, Any]]) -> list[Row]:
    out: list[Row] = []
    for r in rows:
        name = f"gliner2-base shape {r['arch']}, {r['parameters'] / 1e6:.0f}M parameters"
        out += [
            (
                f"session step vs native step, interleaved ({name})",
                f"{r['step_ratio']:.3f}",
                f"{r['session_step_s']:.2f} s vs {r['native_step_s']:.2f} s (medians)",
            ),
            (
                f"checkpoint save vs raw write+fsync of the same bytes ({name})",
                _spread(r, "save_ratio"),
                f"{_spread(r, 'save_s')} s vs {_spread(r, 'raw_write_s')} s, {r['checkpoint_bytes'] / 1e9:.2f} GB; "
                f"extra peak RAM {r['save_extra_rss']:.2f}x the checkpoint; target <= 1.2",
            ),
        ]
        if "final_save_ratio" in r:
            out.append(
                (
                    f"a finished run's checkpoint (around the page cache) vs raw write+fsync ({name})",
                    _spread(r, "final_save_ratio"),
                    f"{_spread(r, 'final_save_s')} s vs {_spread(r, 'raw_write_s')} s; the same state as the row "
                    "above, written as the run's last checkpoint is",
                )
            )
        out += [
            (
                f"checkpoint load vs raw read of the same bytes ({name})",
                _spread(r, "load_ratio"),
                f"{_spread(r, 'load_s')} s vs {_spread(r, 'raw_read_s')} s; vs a raw read into fresh memory "
                f"{_spread(r, 'load_fresh_ratio')} ({_spread(r, 'raw_read_fresh_s')} s); extra peak RAM "
                f"{r['load_extra_rss']:.2f}x; target <= 2",
            ),
        ]
        if "load_cold_ratio" in r:
            out.append(
                (
                    f"checkpoint load vs raw read of the same bytes, both from the disk ({name})",
                    _spread(r, "load_cold_ratio"),
                    f"{_spread(r, 'load_cold_s')} s vs {_spread(r, 'raw_read_cold_s')} s, the checkpoint dropped "
                    "from the page cache before each (a checkpoint written long before, or after a reboot); "
                    "target <= 2",
                )
            )
        out += [
            (
                f"resume (flow-side index check + verified load + first batch) vs fresh start (first batch) ({name})",
                _spread(r, "resume_ratio"),
                f"{_spread(r, 'resume_s')} s vs {_spread(r, 'fresh_start_s')} s; the index check "
                f"{r['index_check_s']:.3f} s (a full verification, not done by the flow: {r['verify_s']:.2f} s); "
                "target <= 1.2",
            ),
            (
                f"flow-process peak RSS during a resume, flow side alone ({name})",
                f"{r['flow_rss_mb']:.0f} MB",
                f"of it added by the resume steps {r['flow_resume_extra_mb']:.1f} MB; target < 300 MB",
            ),
        ]
        for p, where in (("worker_step", "a step-boundary checkpoint"), ("worker", "a mid-window checkpoint")):
            if f"{p}_resume_ratio" not in r:
                continue
            out += [
                (
                    f"resume from {where} in a fresh worker-like process that imported before its checkpoint was known "
                    f"(a spare) vs a fresh start there, to the first batch ({name})",
                    _spread(r, f"{p}_resume_ratio"),
                    f"{_spread(r, f'{p}_resume_s')} s vs {_spread(r, f'{p}_fresh_s')} s after the imports; of it the "
                    f"load after the build {_spread(r, f'{p}_load_s')} s, the first batch "
                    f"{_spread(r, f'{p}_resume_batch_s')} s vs {_spread(r, f'{p}_fresh_batch_s')} s"
                    + _kept(r, p, "resume_ratio", f"{p}_kept_resume_batch_s")
                    + "; target <= 1.2",
                ),
                (
                    f"resume from {where} in a fresh worker-like process that imported before its checkpoint was known "
                    f"(a spare) vs a fresh start there, to the first optimizer update ({name})",
                    _spread(r, f"{p}_update_ratio"),
                    f"{_spread(r, f'{p}_resume_update_s')} s vs {_spread(r, f'{p}_fresh_update_s')} s (a fresh start "
                    "allocates its AdamW moments at its first update, a resume before its first batch)"
                    + _kept(r, p, "update_ratio")
                    + "; target <= 1.2",
                ),
            ]
            if f"{p}_spawned_ratio" in r:
                out.append(
                    (
                        f"resume from {where} in a worker spawned for its run (a restart within a run: the "
                        f"checkpoint's read begins before transformers and gliner2 are imported) vs a fresh start, "
                        f"from the process's start, imports included ({name})",
                        _spread(r, f"{p}_spawned_ratio"),
                        f"{_spread(r, f'{p}_spawned_s')} s vs {_spread(r, f'{p}_fresh_from_start_s')} s to the first "
                        f"batch, of it the load after the build {_spread(r, f'{p}_spawned_load_s')} s; to the first "
                        f"update {_spread(r, f'{p}_spawned_update_ratio')}; target <= 1.2",
                    )
                )
        if "overlap_bg_vs_sync" in r:
            out.append(
                (
                    f"training time lost per checkpoint, background vs blocking write ({name})",
                    f"{r['overlap_bg_vs_sync']:.2f}",
                    f"{r['overlap_bg_lost_s']:.2f} s vs {r['overlap_sync_lost_s']:.2f} s; snapshot "
                    f"{r['overlap_snapshot_s']:.2f} s, write {r['overlap_bg_write_s']:.2f} s during "
                    f"{r['overlap_bg_steps']:.0f} steps of {r['overlap_step_s']:.2f} s",
                )
            )
    return out


def cli_resume_rows(results: list[dict[str, Any]]) -> list[Row]:
    """bench/cli_resume.py: the whole command run again after a crash against a fresh start, from the launch."""
    out: list[Row] = []
    for r in results:
        fresh = [run["first"] for run in r["times"]["fresh"]]
        for variant, how in (("resume", "its checkpoint cached"), ("resume-cold", "its checkpoint out of the cache")):
            seconds = [run["first"] for run in r["times"][variant]]
            out.append(
                (
                    f"`prefect-gliner2 train` run again after a crash vs a fresh start, launch to first batch, {how} "
                    f"(gliner2-base shape {r['arch']}, {r['checkpoint_bytes'] / 1e9:.2f} GB checkpoint)",
                    _median_range(r[f"{variant}_ratio"], ".2f"),
                    f"{_median_range(seconds, '.2f')} s vs {_median_range(fresh, '.2f')} s, {len(seconds)} turns; "
                    "target <= 1.2",
                )
            )
    return out


def markdown(command: str, description: str, rows: list[Row], raw: dict[str, str], seconds: float) -> str:
    lines = [
        "# Benchmark report",
        "",
        f"- command: `{command}`",
        f"- machine: {description}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, total {seconds:.0f} s",
        "",
        "| measurement | ratio | detail |",
        "|---|---:|---|",
    ]
    lines += [f"| {m} | {r} | {d} |" for m, r, d in rows]
    lines += ["", "Ratios are measured side by side in this one run (lower is better; 1.00 = no overhead).", ""]
    for name, output in raw.items():
        lines += [f"## {name}", "", "```", output.strip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run all benchmarks and write one markdown report.")
    parser.add_argument("--out", default=str(BENCH / "REPORT.md"), help="markdown file (default bench/REPORT.md)")
    parser.add_argument("--plan-sizes", default="10000,100000,300000", help="record counts for bench/plan.py")
    parser.add_argument(
        "--chaos",
        default="--seed 0",
        help="arguments for bench/chaos.py (default: all four cases, all kill kinds, storage faults)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated benchmarks to skip: plan,session,flow,sliced,memory,checkpoint,chaos,realsize,cliresume",
    )
    parser.add_argument("--flow-repeat", type=int, default=3, help="pairs of runs of bench/flow.py")
    parser.add_argument("--flow-minutes", type=float, default=1.0, help="bench/flow.py's native run, in minutes")
    parser.add_argument("--sliced-seconds", type=float, default=240.0, help="bench/flow_sliced.py, each side")
    parser.add_argument("--sliced-turn", type=float, default=0.5, help="bench/flow_sliced.py's turns, in seconds")
    parser.add_argument("--device", default="cpu", help="where session.py and flow.py train: cpu or cuda")
    parser.add_argument("--bf16", action="store_true", help="session.py and flow.py in bf16 (CUDA with native bf16)")
    args = parser.parse_args(argv)
    on = ["--device", args.device] + (["--bf16"] if args.bf16 else [])
    skip = set(filter(None, args.skip.split(",")))
    started = time.perf_counter()
    rows: list[Row] = []
    raw: dict[str, str] = {}
    flow_results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        if "session" not in skip:
            out, _, code = run("session.py", "--repeats", "3", *on, "--json", f"{tmp}/session.json", timeout=1200)
            raw[f"bench/session.py --repeats 3 {' '.join(on)}"] = out
            if code == 0:
                rows += session_rows(json.loads(Path(f"{tmp}/session.json").read_text()))
        if "flow" not in skip:
            flow_args = ["--minutes", str(args.flow_minutes), "--repeat", str(args.flow_repeat), *on]
            out, _, code = run("flow.py", *flow_args, "--json", f"{tmp}/flow.json", timeout=7200)
            raw[f"bench/flow.py {' '.join(flow_args)}"] = out
            if code == 0:
                flow_results = json.loads(Path(f"{tmp}/flow.json").read_text())
                rows += flow_rows(flow_results)
        if "sliced" not in skip:
            sliced_args = ["--seconds", str(args.sliced_seconds), "--slice", str(args.sliced_turn), *on]
            out, _, code = run("flow_sliced.py", *sliced_args, "--json", f"{tmp}/sliced.json", timeout=3600)
            raw[f"bench/flow_sliced.py {' '.join(sliced_args)}"] = out
            if code == 0:
                sliced_results = json.loads(Path(f"{tmp}/sliced.json").read_text())
                rows += sliced_rows(sliced_results) + five_minute_rows(flow_results, sliced_results)
        if "memory" not in skip:
            out, _, code = run("memory.py", "--json", f"{tmp}/memory.json", timeout=1800)
            raw["bench/memory.py"] = out
            if code == 0:
                rows += memory_rows(json.loads(Path(f"{tmp}/memory.json").read_text()))
        if "checkpoint" not in skip:
            out, _, code = run("checkpoint_cost.py", "--json", f"{tmp}/checkpoint.json", timeout=600)
            raw["bench/checkpoint_cost.py"] = out
            if code == 0:
                rows += checkpoint_cost_rows(json.loads(Path(f"{tmp}/checkpoint.json").read_text()))
        if "plan" not in skip:
            out, _, _ = run("plan.py", "--sizes", args.plan_sizes, timeout=900)
            raw[f"bench/plan.py --sizes {args.plan_sizes}"] = out
            rows += plan_rows(out)
        if "chaos" not in skip:
            out, _, code = run("chaos.py", *shlex.split(args.chaos), "--json", f"{tmp}/chaos.json", timeout=900)
            raw[f"bench/chaos.py {args.chaos}"] = out
            if Path(f"{tmp}/chaos.json").exists():
                rows += chaos_rows(json.loads(Path(f"{tmp}/chaos.json").read_text()))
        if "realsize" not in skip:
            out, _, code = run("realsize.py", *on, "--json", f"{tmp}/realsize.json", timeout=3600)
            raw[f"bench/realsize.py {' '.join(on)}"] = out
            if code == 0:
                rows += realsize_rows(json.loads(Path(f"{tmp}/realsize.json").read_text()))
        if "cliresume" not in skip:
            out, _, code = run("cli_resume.py", "--arch", "span,boundary", "--json", f"{tmp}/cli.json", timeout=2400)
            raw["bench/cli_resume.py --arch span,boundary"] = out
            if code == 0:
                rows += cli_resume_rows(json.loads(Path(f"{tmp}/cli.json").read_text()))
    command = " ".join([Path(sys.executable).name, "bench/run_all.py", *(argv if argv is not None else sys.argv[1:])])
    report = markdown(command, machine(args.device), rows, raw, time.perf_counter() - started)
    print(report)
    Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
