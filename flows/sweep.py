"""The sweep flow: one training run per point of a grid or list of config overrides, fanned out to the workers.

    from prefect_gliner2.flows.sweep import sweep_flow

    board = sweep_flow(
        base={"model": "tiny:span", "train_data": "data/train.jsonl", "valid_data": "data/valid.jsonl",
              "config": {"fp16": False, "bf16": False, "num_epochs": 3}, "storage": "s3://bucket/runs"},
        grid={"encoder_lr": [1e-5, 3e-5], "batch_size": [8, 16]},       # or points=[{...}, {...}]
        sweep_key="ner-lr", max_parallel=4,
    )
    board["rows"][0]                                  # the best point: run key, metric, flow run, export

Each point is a ``run_deployment`` of the training deployment (``gliner2-train/train``) with its own run key,
``<sweep_key>-<sha256 of the base parameters and the point's resolved config, 10 hex>`` (a sweep re-run under the
same ``sweep_key`` with another model, data path, storage or setting trains anew instead of adopting the earlier
results; two points resolving to the same config are refused), and the idempotency key ``<sweep_key>/<run key>``:
a resumed or retried sweep gets the flow runs it already created back from the server instead of starting
duplicates, waits for those still running, and retries (as the Prefect UI's Retry button does: same flow run, same
run key, exact resume) those that crashed or failed; a point that crashes while the sweep waits is retried too
(``point_retries`` times). At most ``max_parallel`` points run at once; with N training worker slots and
``max_parallel >= N`` N runs train at once (the sweep's own deployment runs on the ``sweeps`` work queue, so the
sweep, which only waits, never holds a training slot). The sweep ends with a leaderboard table artifact sorted by the
selection metric (``metric_for_best``), linking each flow run and export; a point's numbers come from its run
directory's durable summary, so training results need no result persistence. When a point did not complete
after its retries, the sweep publishes the leaderboard and then fails with ``SweepIncompleteError`` naming those
points (a sweep with holes is not a success an automation should act on).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Mapping
from typing import Annotated, Any
from uuid import UUID

from prefect import flow, get_run_logger
from pydantic import Field, ValidationError

from prefect_gliner2.flows.params import TrainingSettings
from prefect_gliner2.flows.prefect_compat import interrupts_surface, retry_in_place
from prefect_gliner2.flows.prefect_ui import run_logger
from prefect_gliner2.flows.report_text import artifact_key
from prefect_gliner2.runtime.prepare import default_storage
from prefect_gliner2.runtime.rundir import RunDirectory, validate_run_key
from prefect_gliner2.session_core import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError, TransientError

__all__ = ["SweepIncompleteError", "leaderboard_rows", "retry_point", "sweep_flow", "sweep_outcome", "sweep_points"]

TRAIN_DEPLOYMENT = "gliner2-train/train"
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
PER_POINT = frozenset({"run_key", "export_to"})  # train_flow parameters the sweep sets per point


class SweepIncompleteError(TransientError):
    """Some points of a sweep did not complete (transient: retrying the sweep retries them)."""


def sweep_points(
    base: Mapping[str, Any], grid: Mapping[str, list[Any]] | None, points: list[dict[str, Any]] | None, sweep_key: str
) -> list[dict[str, Any]]:
    """The sweep's points, each with its overrides, validated config and run key (same inputs, same keys)."""
    if (grid is None) == (points is None):
        raise ConfigError("pass exactly one of grid (field -> list of values) or points (a list of override dicts)")
    if grid is not None:
        empty = [name for name, values in grid.items() if not isinstance(values, list) or not values]
        if empty:
            raise ConfigError(f"grid fields {empty} need a non-empty list of values each")
        names = sorted(grid)
        overrides = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(grid[n] for n in names))]
    else:
        overrides = [dict(point) for point in points or []]
    if not overrides:
        raise ConfigError("the sweep has no points: give at least one override")
    owned = sorted(set(base) & PER_POINT)
    if owned:
        raise ConfigError(
            f"the sweep's base sets {owned}: each point gets its own run key and exports into its own run directory;"
            " remove them from base"
        )
    base_config = _base_training_config(base.get("config"))
    shared = {name: value for name, value in base.items() if name != "config"}
    found, seen = [], set()
    for number, override in enumerate(overrides):
        try:
            point_config = TrainingConfig.from_dict({**base_config.to_dict(), **override})
        except ConfigError as exc:
            raise ConfigError(f"sweep point {number} {override}: {exc}") from None
        cfg = point_config.to_dict()
        identity = json.dumps({"base": shared, "config": cfg}, sort_keys=True, default=str)  # what it trains on
        run_key = validate_run_key(f"{sweep_key}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}")
        if run_key in seen:
            raise ConfigError(f"sweep point {number} {override} trains what an earlier point does; list each once")
        seen.add(run_key)
        form = TrainingSettings.model_validate(point_config).model_dump(mode="json")  # what the run form takes
        found.append({"overrides": override, "config": cfg, "form": form, "run_key": run_key})
    return found


def _base_training_config(config: Any) -> TrainingConfig:
    """The sweep's base config, given as the run form's settings or as flat TrainingConfig fields."""
    if isinstance(config, TrainingConfig):
        return config
    try:
        return TrainingSettings.model_validate(config or {}).to_training_config()
    except ValidationError as exc:
        raise ConfigError(f"the sweep's base config is not valid: {exc}") from None


@flow(name="gliner2-sweep", persist_result=False)
def sweep_flow(
    base: dict[str, Any],
    grid: dict[str, list[Any]] | None = None,
    points: list[dict[str, Any]] | None = None,
    sweep_key: str = "sweep",
    max_parallel: Annotated[int, Field(ge=1)] = 2,
    deployment: str = TRAIN_DEPLOYMENT,
    poll_seconds: Annotated[float, Field(gt=0)] = 5.0,
    point_retries: Annotated[int, Field(ge=0)] = 2,
) -> dict[str, Any]:
    """Train one run per sweep point through the training deployment; returns the leaderboard.

    Args:
        base: train_flow parameters shared by every point (model, train_data, valid_data, config, storage, ...).
        grid: Config field -> list of values; every combination is a point.
        points: Alternatively, an explicit list of config overrides.
        sweep_key: Names the sweep; each point's run key is derived from it and the point's overrides.
        max_parallel: Points running at once (set it to the number of worker slots).
        deployment: The training deployment to run ("flow-name/deployment-name").
        poll_seconds: How often to poll the points' flow run states.
        point_retries: How often this sweep retries a point whose flow run crashes while it waits (the retry
            resumes it exactly); a point found crashed or failed when the sweep starts or resumes is retried too.
    """
    with interrupts_surface():
        logger = get_run_logger()
        validate_run_key(sweep_key)
        todo = sweep_points(base, grid, points, sweep_key)
        logger.info("sweep %s: %d points, at most %d at once", sweep_key, len(todo), max_parallel)
        runs: dict[str, Any] = {}
        retried: dict[str, int] = {}
        waiting = list(todo)
        while waiting or any(_state(run) not in FINAL for run in runs.values()):
            active = sum(_state(run) not in FINAL for run in runs.values())
            while waiting and active < max_parallel:
                point = waiting.pop(0)
                runs[point["run_key"]] = _launch(point, base, sweep_key, deployment)
                active += 1
            time.sleep(poll_seconds)
            runs = {key: _refresh(run) for key, run in runs.items()}
            runs.update(_retry_crashed(runs, retried, point_retries))
        rows = leaderboard_rows(todo, runs, base)
        _publish(sweep_key, rows)
        return sweep_outcome(sweep_key, rows)


def sweep_outcome(sweep_key: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's result; when a point did not complete (after its retries), the sweep fails, naming the points
    (the leaderboard is published first; a retry of the sweep flow run retries those points and adopts the rest)."""
    failed = [row["run_key"] for row in rows if row["state"] != "COMPLETED"]
    if failed:
        states = ", ".join(f"{row['run_key']} ({row['state']})" for row in rows if row["run_key"] in failed)
        raise SweepIncompleteError(
            f"sweep {sweep_key}: {len(failed)} of {len(rows)} point(s) did not complete: {states}; the leaderboard "
            "lists the others. Retry this sweep flow run to retry those points (completed ones are adopted)."
        )
    return {"sweep_key": sweep_key, "rows": rows, "failed": failed}


def _launch(point: dict[str, Any], base: Mapping[str, Any], sweep_key: str, deployment: str) -> Any:
    """Create (or get back) the point's flow run; a crashed or failed one from an earlier attempt is retried."""
    from prefect.deployments import run_deployment

    parameters = {**base, "config": point["form"], "run_key": point["run_key"]}
    run: Any = run_deployment(
        deployment,
        parameters=parameters,
        timeout=0,
        idempotency_key=f"{sweep_key}/{point['run_key']}",
        tags=["gliner2-sweep", f"sweep:{sweep_key}"],
        flow_run_name=point["run_key"],
        as_subflow=False,
    )
    logger = get_run_logger()
    state = _state(run)
    if state in ("CRASHED", "FAILED"):
        logger.info("retrying the %s point %s (flow run %s): it resumes exactly", state, point["run_key"], run.id)
        retry_point(run.id)
        run = _refresh(run)
    else:
        logger.info("point %s: flow run %s (%s)", point["run_key"], run.id, state or "new")
    return run


def _retry_crashed(runs: Mapping[str, Any], retried: dict[str, int], limit: int) -> dict[str, Any]:
    """Retry the points whose flow run crashed while the sweep waited (at most `limit` times each)."""
    again = {}
    for run_key, run in runs.items():
        if _state(run) != "CRASHED" or retried.get(run_key, 0) >= limit:
            continue
        retried[run_key] = retried.get(run_key, 0) + 1
        get_run_logger().info(
            "point %s crashed (flow run %s): retry %d of %d, it resumes exactly",
            run_key,
            run.id,
            retried[run_key],
            limit,
        )
        retry_point(run.id)
        again[run_key] = _refresh(run)
    return again


def retry_point(flow_run_id: UUID) -> bool:
    """Retry a crashed or failed point's flow run in place, as the Prefect UI's Retry button does
    (``prefect_compat.retry_in_place``); a worker then runs the same flow run again. True when the server accepted
    it."""
    accepted, reason = retry_in_place(flow_run_id, "retried by its sweep")
    if not accepted:
        run_logger().warning("Prefect refused to retry flow run %s (%s)", flow_run_id, reason)
    return accepted


def _refresh(run: Any) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run.id)


def _state(run: Any) -> str | None:
    return run.state.type.value if run.state is not None else None


def leaderboard_rows(
    todo: list[dict[str, Any]], runs: Mapping[str, Any], base: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One row per point, best first by the selection metric; points without a metric last."""
    storage = str(base.get("storage") or default_storage())
    rows = []
    for point in todo:
        run = runs[point["run_key"]]
        cursor = RunDirectory(storage, point["run_key"]).read_cursor()
        summary = (cursor.summary if cursor is not None else None) or {}
        rows.append(
            {
                "run_key": point["run_key"],
                "overrides": json.dumps(point["overrides"], sort_keys=True),
                "metric": point["config"]["metric_for_best"],
                "best_metric": summary.get("best_metric"),
                "best_step": summary.get("best_step"),
                "total_steps": summary.get("total_steps"),
                "state": _state(run),
                "flow_run": _flow_run_link(run.id),
                "export": summary.get("export"),
                "greater_is_better": point["config"]["greater_is_better"],
            }
        )

    def order(row: dict[str, Any]) -> tuple[bool, float]:
        value = row["best_metric"]
        if value is None:
            return (True, 0.0)
        return (False, -value if row["greater_is_better"] else value)

    rows.sort(key=order)
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    return rows


def _flow_run_link(flow_run_id: UUID) -> str:
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui else str(flow_run_id)


def _publish(sweep_key: str, rows: list[dict[str, Any]]) -> None:
    from prefect.artifacts import create_table_artifact

    columns = ("rank", "run_key", "overrides", "metric", "best_metric", "best_step", "state", "flow_run", "export")
    create_table_artifact(
        [{name: row[name] for name in columns} for row in rows],
        key=artifact_key(f"sweep-{sweep_key}", "leaderboard"),
        description=f"sweep {sweep_key}: one row per point, best {rows[0]['metric']} first",
    )
