"""The Optuna side of a tuning study: where the study is stored, how it is opened, sampled and pruned, where each
trial's next pause point lies, and how a run's validations are reported to its trial (Prefect-free).

    url = study_storage(None)                   # $PREFECT_GLINER2_STUDY_STORAGE, the Prefect server's PostgreSQL,
                                                # else SQLite under ~/.prefect-gliner2
    study = open_study("ner-lr", url, space, resources, identity, maximize=True)
    trial = ask(study, space, seed=0)           # the same proposals in the same order for the same seed and history
    report(trial, record["validations"], greater=True)
    next_budget(space.pruner, resources, after=record["total_steps"])

Resources are optimizer updates: a trial pauses at the first validation at or after ``min_resource *
reduction_factor**k`` updates (k = 0, 1, ...), the steps where successive halving (and every Hyperband bracket, whose
rungs are a subset of them) can decide; between those points it trains without stopping. The value reported at a
validation is the selection metric of the model the run would ship if it ended there (its best so far).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.search_space import Param, PrunerSpec, SearchSpace

__all__ = [
    "STUDY_STORAGE_ENV",
    "Resources",
    "ask",
    "best_so_far",
    "distributions",
    "next_budget",
    "open_study",
    "optuna_module",
    "own_schema",
    "reached_budget",
    "report",
    "study_resources",
    "study_storage",
    "trial_handle",
]

STUDY_STORAGE_ENV = "PREFECT_GLINER2_STUDY_STORAGE"
PREFECT_DATABASE_ENVS = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")
STUDY_SCHEMA = "prefect_gliner2_optuna"  # the PostgreSQL schema of studies (see ``own_schema``)
IDENTITY_ATTR = "prefect-gliner2:identity"  # what the study searches over: a study key is never reused for another
RESOURCES_ATTR = "prefect-gliner2:resources"  # the pruner's resources, resolved when the study was created


@dataclass(frozen=True)
class Resources:
    """The pruner's resources in optimizer updates (resolved once per study and kept with it)."""

    min_resource: int
    max_resource: int


def optuna_module() -> Any:
    """Optuna, or a clear refusal when the `tune` extra is not installed."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "tuning needs Optuna: pip install 'prefect-gliner2[tune]' (optuna and a PostgreSQL driver)"
        ) from None
    return optuna


def study_storage(given: str | None) -> tuple[str, str]:
    """The study storage URL and where it came from: `given`, else $PREFECT_GLINER2_STUDY_STORAGE, else the
    PostgreSQL database of the Prefect server when this process is configured with it, else a SQLite file under
    ~/.prefect-gliner2 (one host's: a tune flow retried on another host would not find it). A PostgreSQL study
    lives in a schema of its own (``own_schema``)."""
    if given:
        return own_schema(sync_url(given)), "given"
    if os.environ.get(STUDY_STORAGE_ENV):
        return own_schema(sync_url(os.environ[STUDY_STORAGE_ENV])), f"${STUDY_STORAGE_ENV}"
    for name in PREFECT_DATABASE_ENVS:
        url = os.environ.get(name, "")
        if url.startswith("postgresql"):
            return own_schema(sync_url(url)), f"the Prefect server's database (${name})"
    home = os.path.join(os.path.expanduser("~"), ".prefect-gliner2")
    os.makedirs(home, exist_ok=True)
    return f"sqlite:///{home}/studies.db", "the local default (SQLite)"


def sync_url(url: str) -> str:
    """A SQLAlchemy URL with a synchronous driver (Optuna's storage is synchronous; Prefect's URLs name asyncpg and
    aiosqlite)."""
    for async_driver, sync_driver in (
        ("postgresql+asyncpg://", "postgresql+psycopg://"),
        ("sqlite+aiosqlite", "sqlite"),
    ):
        if url.startswith(async_driver):
            return sync_driver + url[len(async_driver) :]
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def own_schema(url: str) -> str:
    """A PostgreSQL URL whose connections use the schema ``STUDY_SCHEMA`` (created when missing), unless the URL sets
    its own connection ``options``: Optuna and Prefect both keep an ``alembic_version`` table, so a study in the
    Prefect server's database needs a schema of its own (``optuna-dashboard`` takes the URL this returns)."""
    if not url.startswith("postgresql") or "options=" in url:
        return url
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {STUDY_SCHEMA}"))
    finally:
        engine.dispose()
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{STUDY_SCHEMA}"


def open_study(
    key: str, url: str, space: SearchSpace, resources: Resources, identity: Mapping[str, Any], *, maximize: bool
) -> Any:
    """Create the study `key` in `url`, or load it when it exists; a study created for another search (base
    parameters, config, space, seed) is refused, so a key never mixes two searches. The resources recorded at its
    creation are the ones it keeps."""
    optuna = optuna_module()
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(
        storage=storage,
        study_name=key,
        direction="maximize" if maximize else "minimize",
        load_if_exists=True,
    )
    recorded = study.user_attrs.get(IDENTITY_ATTR)
    if recorded is None:
        study.set_user_attr(IDENTITY_ATTR, dict(identity))
        study.set_user_attr(RESOURCES_ATTR, {"min": resources.min_resource, "max": resources.max_resource})
    elif recorded != dict(identity):
        changed = sorted(k for k in set(recorded) | set(identity) if recorded.get(k) != identity.get(k))
        raise ConfigError(
            f"study {key!r} in {url} was created for another search (it differs in {changed}); use a new study key "
            "or the same model, data, config, space and seed"
        )
    study.pruner = _pruner(optuna, space.pruner, study_resources(study))
    return study


def _pruner(optuna: Any, spec: PrunerSpec, resources: Resources) -> Any:
    if spec.kind == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=resources.min_resource, reduction_factor=spec.reduction_factor
        )
    if spec.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=resources.min_resource,
            max_resource=max(resources.max_resource, resources.min_resource),
            reduction_factor=spec.reduction_factor,
        )
    return optuna.pruners.NopPruner()


def study_resources(study: Any) -> Resources:
    """The resources the study keeps (recorded at its creation)."""
    kept = study.user_attrs[RESOURCES_ATTR]
    return Resources(int(kept["min"]), int(kept["max"]))


def distributions(space: SearchSpace) -> dict[str, Any]:
    optuna = optuna_module()
    return {param.name: _distribution(optuna, param) for param in space.params}


def _distribution(optuna: Any, param: Param) -> Any:
    found = optuna.distributions
    if param.kind == "categorical":
        return found.CategoricalDistribution(list(param.choices))
    assert param.low is not None and param.high is not None, "a range has bounds"
    if param.kind == "int":
        return found.IntDistribution(int(param.low), int(param.high), log=param.log, step=int(param.step or 1))
    return found.FloatDistribution(float(param.low), float(param.high), log=param.log, step=param.step)


def ask(study: Any, space: SearchSpace, seed: int) -> Any:
    """The next trial (an enqueued one first). The sampler is seeded from `seed` and the trial's number, so with
    one trial at a time the proposals are the same in the same order, also across a restart of the study."""
    optuna = optuna_module()
    number = len(study.get_trials(deepcopy=False))
    trial_seed = (seed * 1_000_003 + number) % 2**32
    if space.sampler.kind == "random":
        study.sampler = optuna.samplers.RandomSampler(seed=trial_seed)
    else:
        study.sampler = optuna.samplers.TPESampler(seed=trial_seed, n_startup_trials=space.sampler.n_startup_trials)
    return study.ask(distributions(space))


def trial_handle(study: Any, frozen: Any) -> Any:
    """A live Trial for a trial of the study that is still running (adopted after a restart)."""
    optuna = optuna_module()
    return optuna.trial.Trial(study, frozen._trial_id)  # noqa: SLF001 - Optuna's documented way for a known id


def next_budget(pruner: PrunerSpec, resources: Resources, after: int) -> int | None:
    """The next pause point (updates) after `after` updates: the smallest ``min_resource * factor**k`` above it;
    None without a pruner (the trial trains to its end)."""
    if pruner.kind == "none":
        return None
    budget = resources.min_resource
    while budget <= after:
        budget *= pruner.reduction_factor
    return budget


def reached_budget(pruner: PrunerSpec, resources: Resources, reached: int) -> int | None:
    """The pause point that a pause at `reached` updates answered: the largest ``min_resource * factor**k`` at or
    below it (``min_resource`` below that); None without a pruner."""
    if pruner.kind == "none":
        return None
    budget = resources.min_resource
    while budget * pruner.reduction_factor <= reached:
        budget *= pruner.reduction_factor
    return budget


def best_so_far(validations: Iterable[Mapping[str, Any]], greater: bool) -> list[tuple[int, float]]:
    """(step, the best selection metric up to that validation) for each validation; a missing or NaN value counts
    as NaN (Optuna's pruners prune it)."""
    best: float | None = None
    out = []
    for entry in validations:
        value = entry.get("value")
        if isinstance(value, (int, float)) and not math.isnan(value):
            best = value if best is None or (value > best if greater else value < best) else best
        out.append((int(entry["step"]), best if best is not None else math.nan))
    return out


def report(trial: Any, validations: Iterable[Mapping[str, Any]], greater: bool) -> int:
    """Report the validations the trial has not seen yet (by step); returns how many were new."""
    seen = set(trial.study._storage.get_trial(trial._trial_id).intermediate_values)  # noqa: SLF001
    new = [(step, value) for step, value in best_so_far(validations, greater) if step not in seen]
    for step, value in new:
        trial.report(value, step)
    return len(new)
