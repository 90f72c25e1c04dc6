"""The tuning flow: an Optuna study whose trials are training runs, pruned at validation points, paused (not lost) when
pruned, resumable at any moment.

    from prefect_gliner2.flows.tune import tune_flow

    board = tune_flow(
        base={"model": "tiny:span", "train_data": "train.jsonl", "valid_data": "valid.jsonl",
              "config": {"fp16": False, "bf16": False, "num_epochs": 6}, "storage": "s3://bucket/runs"},
        space={"params": {"encoder_lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}},
        trials=20, study_key="ner-lr", parallel=4,             # trials on the fleet: gliner2-train/train
    )
    board["best"]                                               # trial, parameters, metric, export

Each trial is a run of the training flow with its own run key (``flows.tune_trials``), on the fleet through the
training deployment (``deployment``, ``parallel`` at once), or, with ``deployment=None``, in this process one at a
time (the embedded default of ``prefect-gliner2 tune``). The objective is the run's selection metric
(``metric_for_best`` of the base config: the metric of the model the run ships), maximized or minimized as the
config says. Trials pause at validation points where the pruner can decide (``flows.tune_study``); a pruned trial's
run stays paused at that checkpoint, and ``continue_trials`` (trial numbers) continues such runs exactly, to their
end, as new trials of the study; ``continue_best=K`` has the study continue its K most promising pruned trials after
its trials (what early validation points could not tell apart costs only the rest of those runs).

The study lives in Optuna's RDB storage (``study_storage``: any SQLAlchemy URL; default: $PREFECT_GLINER2_STUDY_STORAGE,
the Prefect server's PostgreSQL when this process is configured with its database URL, else SQLite under
~/.prefect-gliner2), so ``optuna-dashboard <url>`` shows it; it is refused under a key created for another search.
Killed at any moment and started again with the same key (or retried in the Prefect UI), the study continues: trials
in flight continue from their runs' checkpoints, and no trial is trained twice from scratch.

Reproducibility. With ``parallel=1`` and a ``seed``, a study proposes the same trials in the same order, prunes the
same ones at the same steps and trains each bit for bit as before, across kills and restarts too (each proposal is
seeded by the seed and the trial's number; the history it conditions on is the same). With ``parallel=K > 1`` each
trial still trains bit for bit as a run of its parameters, but which trials are proposed, and which are pruned,
depends on the order in which trials reach their pause points and end, which timing decides: not reproducible.
"""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict, Field

from prefect_gliner2.flows.prefect_compat import interrupts_surface
from prefect_gliner2.flows.sweep import TRAIN_DEPLOYMENT, sweep_points
from prefect_gliner2.flows.tune_report import best_row, leaderboard_rows, publish_leaderboard, register_best
from prefect_gliner2.flows.tune_segments import InProcess, OnDeployment
from prefect_gliner2.flows.tune_study import Resources, open_study, study_storage
from prefect_gliner2.flows.tune_trials import StudyRunner
from prefect_gliner2.runtime.rundir import validate_run_key
from prefect_gliner2.session_core import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.search_space import SearchSpace, parse_search_space

__all__ = ["RegisterSettings", "check_study", "study_resources_for", "tune_flow"]


class RegisterSettings(BaseModel):
    """Register the best trial's model in a model registry (a new version; promotion stays the retrain flow's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registry_root: str = Field(min_length=1, description="The registry's root directory or fsspec URL.")
    model_name: str = Field(min_length=1, description="The registered model's name.")


@flow(name="gliner2-tune", persist_result=False)
def tune_flow(
    base: dict[str, Any],
    space: dict[str, Any],
    trials: Annotated[int, Field(ge=1)] = 10,
    study_key: str = "study",
    study_storage_url: str | None = None,
    parallel: Annotated[int, Field(ge=1)] = 1,
    deployment: str | None = TRAIN_DEPLOYMENT,
    seed: int = 0,
    continue_trials: list[int] | None = None,
    continue_best: Annotated[int, Field(ge=0)] = 0,
    registry: RegisterSettings | None = None,
    poll_seconds: Annotated[float, Field(gt=0)] = 5.0,
    segment_retries: Annotated[int, Field(ge=0)] = 2,
) -> dict[str, Any]:
    """Run an Optuna study whose trials are training runs; returns the leaderboard and the best trial.

    Args:
        base: train_flow parameters every trial shares (model, train_data, valid_data, config, storage,
            checkpointing, execution); the config needs validation (valid_data and an eval_strategy).
        space: The search space (a search space file's content: params, pruner, sampler).
        trials: Trials the study should have (sampled ones; continuations come on top). Raising it on a later run
            of the same study key adds trials.
        study_key: Names the study (and prefixes its trials' run keys); the same key continues it.
        study_storage_url: Optuna storage URL (SQLAlchemy; default: see the module docstring).
        parallel: Trials training at once (on the fleet; 1 in this process).
        deployment: The training deployment that runs trials ("flow-name/deployment-name"); empty: in this process.
        seed: Seeds the sampler (the same trials in the same order with parallel=1).
        continue_trials: Numbers of pruned trials to continue from their pause point to their end.
        continue_best: After the trials, continue this many of the most promising pruned trials to their end (the
            furthest trained first, then the best at its pause point); continuations are trials of their own.
        registry: Register the best trial's model as a new version of a registry model.
        poll_seconds: How often to poll the trials' flow runs (on the fleet).
        segment_retries: How often a trial's crashed flow run is retried (it resumes exactly) before it fails.
    """
    with interrupts_surface():
        logger = get_run_logger()
        validate_run_key(study_key)
        search = parse_search_space(space, "the search space")
        config = check_study(base, search, study_key)
        if deployment is None and parallel > 1:
            raise ConfigError("in this process trials train one at a time: pass a training deployment for parallel")
        url, source = study_storage(study_storage_url)
        logger.info("study %s in %s (%s)", study_key, _masked(url), source)
        resources = study_resources_for(base, config, search)
        identity: dict[str, Any] = {"base": {k: v for k, v in base.items() if k != "config"}}
        identity |= {"config": config.to_dict(), "space": search.to_dict(), "seed": seed}
        greater = bool(config.greater_is_better)
        study = open_study(study_key, url, search, resources, identity, maximize=greater)
        launcher: Any = InProcess()
        if deployment:
            launcher = OnDeployment(
                deployment, study_key, slots=parallel, poll_seconds=poll_seconds, retries=segment_retries
            )
        runner = StudyRunner(
            study, search, base, study_key, seed=seed, launcher=launcher, trials=trials, greater=greater
        )
        runner.run(list(continue_trials or ()), continue_best)
        rows = leaderboard_rows(study.get_trials(deepcopy=False), str(config.metric_for_best), greater)
        publish_leaderboard(study_key, rows)
        best = best_row(rows)
        registered = None
        if best is not None and registry is not None:
            registered = register_best(best, registry.registry_root, registry.model_name, study_key, _masked(url))
        if best is None:
            logger.warning("study %s: no trial completed", study_key)
        return {"study_key": study_key, "storage": _masked(url), "rows": rows, "best": best, "registered": registered}


def check_study(base: dict[str, Any], search: SearchSpace, study_key: str) -> TrainingConfig:
    """The base config, checked with the space before any training: trials validate, and every bound and choice
    makes a valid run (the sweep's checks of the base parameters included)."""
    if "pause_at_step" in base:
        raise ConfigError("the study pauses each trial's run where its pruner decides: remove pause_at_step from base")
    [point] = sweep_points(base, None, [{}], study_key)
    config = TrainingConfig.from_dict(point["config"])
    if not base.get("valid_data") or config.eval_strategy == "no":
        raise ConfigError(
            "a study selects by the validation metric and prunes at validation points: pass valid_data and an "
            "eval_strategy of epoch or steps in the base config"
        )
    search.check_against(config)
    return config


def study_resources_for(base: dict[str, Any], config: TrainingConfig, search: SearchSpace) -> Resources:
    """The pruner's resources in updates: as the space gives them, else from the base config's plan (its first
    validation, its updates)."""
    pruner = search.pruner
    if pruner.min_resource is not None and pruner.max_resource is not None:
        return Resources(pruner.min_resource, pruner.max_resource)
    from prefect_gliner2.runtime.model_sources import model_architecture
    from prefect_gliner2.session_core import ManagedTrainingPlan

    plan = ManagedTrainingPlan(base["train_data"], config, architecture=model_architecture(str(base["model"])))
    validations = plan.validations()
    first = plan.step_after(validations[0]) if validations else 1
    return Resources(pruner.min_resource or first, pruner.max_resource or plan.max_steps)


def _masked(url: str) -> str:
    """The URL without its password (for logs, results and lineage)."""
    from sqlalchemy.engine import make_url

    return str(make_url(url).render_as_string(hide_password=True))
