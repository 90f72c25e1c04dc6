"""Serve every deployment (train, sweep, tune, retrain, extract) from this process, without a work pool.

    python -m prefect_gliner2.deployments.serve                      # Ctrl-C stops serving
    python -m prefect_gliner2.deployments.serve --parameters overrides.json
        # {"retrain-nightly": {"train_data": ...}, ...}

The deployments get the names, tags, parameters, schedules, triggers and concurrency limits that
``deployments/prefect.yaml`` declares, so both ways of running behave the same. Flow runs execute in
subprocesses of this process.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml  # type: ignore[import-untyped]

__all__ = ["PREFECT_FILE", "build_deployments", "load_deployment_specs", "main"]

PREFECT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prefect.yaml")


def load_deployment_specs(path: str = PREFECT_FILE) -> list[dict[str, Any]]:
    """The `deployments:` entries of prefect.yaml (YAML anchors resolved)."""
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    specs = data.get("deployments") if isinstance(data, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{path} declares no deployments; expected a non-empty `deployments:` list")
    return specs


def build_deployments(parameters: Mapping[str, Mapping[str, Any]] | None = None, path: str = PREFECT_FILE) -> list[Any]:
    """One RunnerDeployment per prefect.yaml entry; `parameters[name]` overrides that deployment's defaults."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.events import DeploymentEventTrigger
    from prefect.schedules import Cron

    overrides = dict(parameters or {})
    built = []
    for spec in load_deployment_specs(path):
        flow = _load_flow(str(spec["entrypoint"]))
        schedules = [
            Cron(item["cron"], timezone=item.get("timezone"), slug=item.get("slug"), active=item.get("active", True))
            for item in spec.get("schedules") or []
        ]
        limit = spec.get("concurrency_limit")
        concurrency = (
            ConcurrencyLimitConfig(limit=limit["limit"], collision_strategy=limit["collision_strategy"])
            if isinstance(limit, dict)
            else limit
        )
        triggers = [DeploymentEventTrigger.model_validate(item) for item in spec.get("triggers") or []]
        built.append(
            flow.to_deployment(
                name=spec["name"],
                description=spec.get("description"),
                tags=list(spec.get("tags") or []),
                parameters={**(spec.get("parameters") or {}), **overrides.pop(spec["name"], {})},
                schedules=schedules,
                concurrency_limit=concurrency,
                enforce_parameter_schema=bool(spec.get("enforce_parameter_schema", True)),
                triggers=triggers,
            )
        )
    if overrides:
        raise ValueError(
            f"parameter overrides for unknown deployment(s) {sorted(overrides)}; "
            f"{path} declares {[d.name for d in built]}"
        )
    return built


def _load_flow(entrypoint: str) -> Any:
    """A ``package.module:flow`` entrypoint (as in prefect.yaml), imported as a module."""
    import importlib

    module, name = entrypoint.rsplit(":", 1)
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--parameters", help="JSON file: {deployment name: {parameter: value}} overrides")
    parser.add_argument("--limit", type=int, default=None, help="most flow runs executing at once")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.parameters:
        with open(args.parameters, encoding="utf-8") as handle:
            overrides = json.load(handle)
    from prefect import serve

    serve(*build_deployments(overrides), limit=args.limit)


if __name__ == "__main__":
    main()
