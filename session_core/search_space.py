"""A tuning study's search space file: the TrainingConfig fields it searches (floats, ints, categoricals), its pruner
and its sampler, checked whole before any training.

    # space.yaml
    params:
      encoder_lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
      num_epochs: {type: int, low: 2, high: 8, step: 2}
      scheduler_type: {type: categorical, choices: [linear, cosine]}
      batch_size: [4, 8]                       # a list: a categorical
    pruner: {type: successive_halving, min_resource: 4, reduction_factor: 3}   # or hyperband, none
    sampler: {type: tpe, n_startup_trials: 5}  # or random

    space = load_search_space("space.yaml")
    space.check_against(base_config)           # every bound and choice makes a valid TrainingConfig

Every refusal is a ``ConfigError`` naming the file, the line and the field, and saying what to write instead.
Resources (``min_resource``, ``max_resource``) count optimizer updates; unset, the study derives them from the base
config's plan (``runtime.study``). Torch-free, Optuna-free: ``runtime.study`` turns this into Optuna's objects.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect_gliner2.session_core.config import TrainingConfig
from prefect_gliner2.session_core.errors import ConfigError

__all__ = ["Param", "PrunerSpec", "SamplerSpec", "SearchSpace", "load_search_space", "parse_search_space"]

# Fields a study may not search, and why (the objective and the pause points must mean the same in every trial).
REFUSED = {
    "metric_for_best": "the study's objective is the selection metric: set it in the base config",
    "greater_is_better": "it follows the selection metric: set metric_for_best in the base config",
    "eval_strategy": "trials pause at validation points: every trial validates the same way (the base config)",
    "fp16": "precision is fixed per study: set fp16/bf16 in the base config",
    "bf16": "precision is fixed per study: set fp16/bf16 in the base config",
    "output_dir": "not a training setting",
    "num_workers": "the session requires 0",
    "local_rank": "distributed training is refused",
    "compile_model": "graph compilation is refused",
    "skip_step_errors": "lossy paths are refused",
    "allow_invalid_samples": "lossy paths are refused",
    "on_capacity_exceeded": "lossy paths are refused",
    "strict_training": "lossy paths are refused",
    "ignore_nonfinite_losses": "lossy paths are refused",
    "max_train_samples": "trials train on the same data",
    "max_eval_samples": "trials validate on the same data",
}
KINDS = ("float", "int", "categorical")
PRUNERS = ("successive_halving", "hyperband", "none")
SAMPLERS = ("tpe", "random")
_PARAM_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"}}
_PARAM_KEYS["categorical"] = {"type", "choices"}
_FIELD_TYPES = typing.get_type_hints(TrainingConfig)


@dataclass(frozen=True)
class Param:
    """One searched field: a float or int range (linear or log, optionally stepped) or a list of choices."""

    name: str
    kind: str  # "float" | "int" | "categorical"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def values_to_check(self) -> tuple[Any, ...]:
        """The values that must each make a valid TrainingConfig: the bounds, or every choice."""
        return self.choices if self.kind == "categorical" else (self.low, self.high)


@dataclass(frozen=True)
class PrunerSpec:
    kind: str = "successive_halving"
    min_resource: int | None = None  # optimizer updates; None: the base plan's first validation
    max_resource: int | None = None  # hyperband only; None: the base plan's updates
    reduction_factor: int = 3


@dataclass(frozen=True)
class SamplerSpec:
    kind: str = "tpe"
    n_startup_trials: int = 10


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    pruner: PrunerSpec = PrunerSpec()
    sampler: SamplerSpec = SamplerSpec()
    where: str = dataclasses.field(default="search space", compare=False)  # the file (for messages)

    def to_dict(self) -> dict[str, Any]:
        """The space as the file would say it (a flow parameter: JSON-ready); ``parse_search_space`` reads it back."""
        params = {p.name: _param_dict(p) for p in self.params}
        return {"params": params, "pruner": _spec_dict(self.pruner), "sampler": _spec_dict(self.sampler)}

    def check_against(self, base: TrainingConfig) -> None:
        """Every bound and choice, set on `base`, must make a valid TrainingConfig (refused before any training)."""
        fields = base.to_dict()
        for param in self.params:
            for value in param.values_to_check():
                try:
                    TrainingConfig.from_dict({**fields, param.name: value})
                except ConfigError as exc:
                    raise ConfigError(
                        f"{self.where}: params.{param.name}: {value!r} does not make a valid training config with "
                        f"the base config ({exc}); narrow the range or change the choices"
                    ) from None


def _param_dict(param: Param) -> dict[str, Any]:
    if param.kind == "categorical":
        return {"type": "categorical", "choices": list(param.choices)}
    out: dict[str, Any] = {"type": param.kind, "low": param.low, "high": param.high, "log": param.log}
    return out if param.step is None else {**out, "step": param.step}


def _spec_dict(spec: PrunerSpec | SamplerSpec) -> dict[str, Any]:
    data = dataclasses.asdict(spec)
    return {"type": data.pop("kind"), **{k: v for k, v in data.items() if v is not None}}


def load_search_space(path_or_url: str | os.PathLike[str]) -> SearchSpace:
    """Read and check a YAML (or JSON) search space file from a local path or any fsspec URL."""
    import fsspec
    import yaml  # type: ignore[import-untyped]

    uri = os.fspath(path_or_url)
    try:
        with fsspec.open(uri, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(
            f"search space file {uri!r} cannot be read ({exc.strerror or exc}); pass a YAML file"
        ) from exc
    try:
        data = yaml.safe_load(text)
        lines = _param_lines(yaml.compose(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"search space file {uri!r} is not valid YAML: {exc}; fix the file") from exc
    return parse_search_space(data, uri, lines)


def _param_lines(node: Any) -> dict[str, int]:
    """The 1-based line of each entry under ``params:`` (for messages)."""
    import yaml

    found: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "params" and isinstance(value, yaml.MappingNode):
                found.update({str(k.value): k.start_mark.line + 1 for k, _ in value.value})
            found.setdefault(str(key.value), key.start_mark.line + 1)
    return found


def parse_search_space(data: Any, where: str = "search space", lines: Mapping[str, int] | None = None) -> SearchSpace:
    """Check a search space given as data (the file's content, or ``SearchSpace.to_dict()``)."""
    lines = lines or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping with a `params:` section, got {type(data).__name__}")
    unknown = sorted(set(data) - {"params", "pruner", "sampler"})
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; a search space has params, pruner and sampler")
    params = data.get("params")
    if not isinstance(params, Mapping) or not params:
        raise ConfigError(f"{where}: `params:` must map TrainingConfig field names to ranges or lists of choices")
    parsed = tuple(_param(str(name), spec, _at(where, lines, str(name))) for name, spec in params.items())
    pruner = _pruner(data.get("pruner") or {}, _at(where, lines, "pruner"))
    sampler = _sampler(data.get("sampler") or {}, _at(where, lines, "sampler"))
    return SearchSpace(parsed, pruner, sampler, where)


def _at(where: str, lines: Mapping[str, int], key: str) -> str:
    return f"{where}, line {lines[key]}" if key in lines else where


def _param(name: str, spec: Any, where: str) -> Param:
    if name not in _FIELD_TYPES:
        close = difflib.get_close_matches(name, sorted(_FIELD_TYPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: params.{name}: not a TrainingConfig field{hint}; search TrainingConfig fields")
    if name in REFUSED:
        raise ConfigError(f"{where}: params.{name} cannot be searched: {REFUSED[name]}")
    if isinstance(spec, list):
        spec = {"type": "categorical", "choices": spec}
    if not isinstance(spec, Mapping) or spec.get("type") not in KINDS:
        raise ConfigError(
            f"{where}: params.{name} needs `type:` one of {list(KINDS)} (or a list of choices), got {spec!r}"
        )
    kind = str(spec["type"])
    extra = sorted(set(spec) - _PARAM_KEYS[kind])
    if extra:
        raise ConfigError(
            f"{where}: params.{name}: unknown key(s) {extra} for a {kind}; it takes {sorted(_PARAM_KEYS[kind])}"
        )
    if kind == "categorical":
        return _categorical(name, spec.get("choices"), where)
    return _range(name, kind, spec, where)


def _categorical(name: str, choices: Any, where: str) -> Param:
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: params.{name}: `choices:` must be a non-empty list")
    bad = [c for c in choices if c is not None and not isinstance(c, (bool, int, float, str))]
    if bad:
        raise ConfigError(f"{where}: params.{name}: choices must be numbers, strings, booleans or null; got {bad!r}")
    if len({repr(c) for c in choices}) != len(choices):
        raise ConfigError(f"{where}: params.{name}: choices {choices!r} repeat a value; list each once")
    return Param(name, "categorical", choices=tuple(choices))


def _range(name: str, kind: str, spec: Mapping[str, Any], where: str) -> Param:
    field_type = str(_FIELD_TYPES[name]).replace("<class '", "").replace("'>", "")  # "float", "float | None"
    if kind not in field_type:
        wanted = "int" if "int" in field_type else "float" if "float" in field_type else "categorical"
        article = "an" if field_type.startswith("int") else "a"
        raise ConfigError(f"{where}: params.{name} is {article} {field_type} field: use `type: {wanted}`")
    low, high = (_number(name, key, spec.get(key), kind, where) for key in ("low", "high"))
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: params.{name}: `log:` must be true or false, got {log!r}")
    if not low < high:
        raise ConfigError(
            f"{where}: params.{name}: low ({low}) must be below high ({high}); to fix a value, set it in the config"
        )
    if log and low <= 0:
        raise ConfigError(f"{where}: params.{name}: a log range needs low > 0, got {low}")
    step = spec.get("step")
    if step is not None:
        step = _number(name, "step", step, kind, where)
        if step <= 0:
            raise ConfigError(f"{where}: params.{name}: step must be > 0, got {step}")
        if log and not (kind == "int" and step == 1):
            raise ConfigError(f"{where}: params.{name}: a log range cannot have a step; drop one of them")
    return Param(name, kind, low=low, high=high, log=log, step=step)


def _number(name: str, key: str, value: Any, kind: str, where: str) -> Any:
    """`value` as the range's number type (a YAML string such as "1e-5" is read as the number it spells)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if kind == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, int) if kind == "int" else isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(value, bool) or not ok:
        wanted = "an integer" if kind == "int" else "a finite number"
        raise ConfigError(f"{where}: params.{name}: `{key}:` must be {wanted}, got {value!r}")
    return value if kind == "int" else float(value)


def _pruner(spec: Any, where: str) -> PrunerSpec:
    data = _spec_mapping(spec, "pruner", PRUNERS, {"type", "min_resource", "max_resource", "reduction_factor"}, where)
    values = {key: _positive(data, key, where) for key in ("min_resource", "max_resource", "reduction_factor")}
    if values["reduction_factor"] is not None and values["reduction_factor"] < 2:
        raise ConfigError(f"{where}: pruner.reduction_factor must be >= 2, got {values['reduction_factor']}")
    low, high = values["min_resource"], values["max_resource"]
    if low is not None and high is not None and high < low:
        raise ConfigError(f"{where}: pruner.max_resource ({high}) must be >= min_resource ({low})")
    kind = str(data.get("type", "successive_halving"))
    if high is not None and kind != "hyperband":
        raise ConfigError(f"{where}: pruner.max_resource is a hyperband setting; drop it or use type: hyperband")
    present = {k: v for k, v in values.items() if v is not None}
    return PrunerSpec(kind=kind, **present)


def _sampler(spec: Any, where: str) -> SamplerSpec:
    data = _spec_mapping(spec, "sampler", SAMPLERS, {"type", "n_startup_trials"}, where)
    startup = data.get("n_startup_trials", SamplerSpec.n_startup_trials)
    if isinstance(startup, bool) or not isinstance(startup, int) or startup < 0:
        raise ConfigError(f"{where}: sampler.n_startup_trials must be an integer >= 0, got {startup!r}")
    return SamplerSpec(kind=str(data.get("type", "tpe")), n_startup_trials=startup)


def _spec_mapping(spec: Any, what: str, kinds: tuple[str, ...], keys: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: `{what}:` must be a mapping with a `type:` of {list(kinds)}")
    if spec.get("type", kinds[0]) not in kinds:
        raise ConfigError(f"{where}: {what}.type must be one of {list(kinds)}, got {spec.get('type')!r}")
    extra = sorted(set(spec) - keys)
    if extra:
        raise ConfigError(f"{where}: unknown {what} key(s) {extra}; it takes {sorted(keys)}")
    return spec


def _positive(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer (optimizer updates), got {value!r}")
    return value
