"""An export as an MLflow logged model of its training run (MLflow 3's "logged models"): the export directory as
the artifact of a pyfunc model that extracts with the export's fitted thresholds and trained schema, those
thresholds and that schema as the model's parameters (the run's own are on the run), the validation metrics of the
exported weights' step linked to it; found again by its weights digest, so an export is logged once and a registry
version finds the logged model it came from.

The pyfunc flavour's arguments (the model code, requirements, input example) come from the caller
(``runtime.mlflow_model.pyfunc_model``: the model code extracts with the runtime's extractor, a layer above this
one). Prefect-free and torch-free; imports mlflow only when called (the mirror's thread).
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prefect_gliner2.session_core.layout import EXPORT_MARKER_FILE
from prefect_gliner2.session_core.storage import is_local, resolve
from prefect_gliner2.session_core.thresholds import DEFAULT_THRESHOLD, KINDS, THRESHOLDS_KEY, Thresholds

__all__ = ["MODEL_TYPE", "WEIGHTS_TAG", "PyfuncModel", "export_info", "find_logged_model", "log_export"]

MODEL_TYPE = "gliner2"
WEIGHTS_TAG = "prefect-gliner2.weights-sha256"  # the export's weights digest (export.json weights_sha256)
EXPORT_TAG = "prefect-gliner2.export"
MAX_PARAM = 6000  # MLflow's longest parameter value
PyfuncModel = Callable[[str], Mapping[str, Any]]  # a local export directory -> Model.log's pyfunc arguments


def log_export(
    client: Any,
    run: Any,
    export_uri: str,
    name: str,
    tags: Mapping[str, str],
    params: Mapping[str, Any],
    pyfunc: PyfuncModel,
) -> str:
    """Log the export at `export_uri` as the logged model `name` of MLflow `run` (unless it is logged already) and
    return the model's id; `tags` and `params` (where it comes from) are added to the model's own."""
    import mlflow.pyfunc
    from mlflow.models import Model

    run_id, experiment_id = run.info.run_id, run.info.experiment_id
    with local_directory(export_uri) as local:
        info = json.loads(Path(local, EXPORT_MARKER_FILE).read_text())
        found = find_logged_model(client, experiment_id, run_id, info.get("weights_sha256"))
        if found is not None:
            return str(found.model_id)
        own = {EXPORT_TAG: export_uri, "prefect-gliner2.export-label": str(info.get("label"))}
        if info.get("weights_sha256"):
            own[WEIGHTS_TAG] = str(info["weights_sha256"])
        # in the run's experiment (Model.log alone would create it in the active experiment, whatever that is)
        model = client.create_logged_model(
            experiment_id, name=name, source_run_id=run_id, tags={**tags, **own}, model_type=MODEL_TYPE
        )
        client.log_model_params(model.model_id, {**_strings(params), **model_params(info)})
        Model.log(
            artifact_path=None,
            name=name,
            flavor=mlflow.pyfunc,
            run_id=run_id,
            model_id=model.model_id,
            step=int(info.get("step") or 0),  # the validation metrics of this step are linked to the model
            **pyfunc(local),
        )
        return str(model.model_id)


def find_logged_model(client: Any, experiment_id: str, run_id: str, weights_sha256: str | None = None) -> Any:
    """The newest READY logged model of `run_id` (with these weights, when given), or None."""
    from mlflow.entities import LoggedModelStatus

    query = f"source_run_id = '{_quoted(run_id)}'"  # (a status filter matches nothing in MLflow 3.17)
    if weights_sha256:
        query += f" AND tags.`{WEIGHTS_TAG}` = '{_quoted(weights_sha256)}'"
    order = [{"field_name": "creation_time", "ascending": False}]
    found = client.search_logged_models([experiment_id], filter_string=query, order_by=order)
    return next((model for model in found if model.status == LoggedModelStatus.READY), None)


def model_params(info: Mapping[str, Any]) -> dict[str, str]:
    """The logged model's own parameters from an export.json: its thresholds (``threshold``, per label
    ``threshold/<kind>/<label>``, ``thresholds_fitted``), the trained ``schema`` (JSON), the weights' step."""
    recorded = info.get(THRESHOLDS_KEY)
    params: dict[str, str] = {"export_step": str(info.get("step")), "export_label": str(info.get("label"))}
    if isinstance(recorded, Mapping):
        thresholds = Thresholds.from_dict(recorded)
        params["threshold"] = str(thresholds.threshold)
        params["thresholds_fitted"] = str(thresholds.fitted)
        for kind in KINDS:
            for label, value in sorted(getattr(thresholds, kind).items()):
                params[_key(f"threshold/{kind}/{label}")] = str(value)
    else:
        params["threshold"] = str(DEFAULT_THRESHOLD)
        params["thresholds_fitted"] = "False"
    schema = json.dumps(info.get("schema") or {}, sort_keys=True)
    params["schema"] = schema if len(schema) <= MAX_PARAM else f"({len(schema)} characters: see export.json)"
    return params


def export_info(uri: str) -> dict[str, Any]:
    """A model directory's export.json ({} without one)."""
    fs, path = resolve(uri)
    marker = f"{path.rstrip('/')}/{EXPORT_MARKER_FILE}"
    return dict(json.loads(fs.cat_file(marker))) if fs.exists(marker) else {}


@contextlib.contextmanager
def local_directory(uri: str) -> Iterator[str]:
    """A local path of the directory at `uri`: itself when local, else a temporary copy (removed afterwards)."""
    fs, path = resolve(uri)
    if is_local(fs):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="gliner2-mlflow-") as local:
        fs.get(path.rstrip("/") + "/", local, recursive=True)
        yield local


def _strings(params: Mapping[str, Any]) -> dict[str, str]:
    return {_key(str(key)): str(value)[:MAX_PARAM] for key, value in params.items()}


def _key(key: str) -> str:
    """An MLflow parameter key: characters MLflow refuses become ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)


def _quoted(value: str) -> str:
    return str(value).replace("'", "\\'")
