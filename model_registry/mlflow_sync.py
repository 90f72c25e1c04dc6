"""The optional MLflow mirror: each training run's parameters, step metrics, validation metrics and exported model
as one MLflow run (the export as the run's logged model, ``model_registry.mlflow_logged_model``), and the
registry's promotions as MLflow model versions of those logged models with the alias ``champion``.

On when ``MLFLOW_TRACKING_URI`` is set (MLflow's own variable; ``PREFECT_GLINER2_MLFLOW=0`` turns the mirror off
anyway) and the ``mlflow`` client is installed (``pip install 'prefect-gliner2[mlflow]'``); the experiment is
``MLFLOW_EXPERIMENT_NAME`` or ``prefect-gliner2``. Without it nothing here imports mlflow. The mirror never fails a
run: an MLflow error is logged as a warning and training goes on.

Resumable: a run key's MLflow run is found again by its tags (run key and plan fingerprint), so a resumed run
continues it; metrics are logged by step, and a resumed run logs only the steps past the last one MLflow already
holds (the replayed steps are bit-identical), so a crash never duplicates a step. A registry version is one MLflow
model version (tagged with the registry's version id, found again rather than created twice) whose source is the
logged model of the training run with the same weights. Prefect-free and torch-free.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prefect_gliner2.model_registry.mlflow_logged_model import PyfuncModel, export_info, find_logged_model, log_export

__all__ = ["CHAMPION", "MlflowRun", "enabled", "find_run", "mirror_promotion"]

logger = logging.getLogger(__name__)
CHAMPION = "champion"  # the alias of the promoted (CURRENT) version
RUN_KEY_TAG = "prefect-gliner2.run-key"
FINGERPRINT_TAG = "prefect-gliner2.plan-fingerprint"
VERSION_TAG = "prefect-gliner2.version"
FLOW_RUN_TAG = "prefect-gliner2.flow-run-id"
BATCH = 1000  # metrics per log_batch request (MLflow's limit)
MIRROR_TIMEOUT = 120.0  # seconds a promotion waits for its MLflow mirror
_warned: set[str] = set()


def enabled() -> bool:
    """True when a tracking server is configured, not switched off, and the mlflow client is installed."""
    if not os.environ.get("MLFLOW_TRACKING_URI") or os.environ.get("PREFECT_GLINER2_MLFLOW", "1").lower() in (
        "0",
        "false",
        "off",
        "no",
    ):
        return False
    try:  # whether it is installed, without importing it (seconds): the mirror's thread imports it
        installed = importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        installed = False
    if not installed:
        _warn_once(
            "missing",
            "MLFLOW_TRACKING_URI is set but mlflow is not installed: runs are not logged to MLflow "
            "(pip install 'prefect-gliner2[mlflow]', or unset MLFLOW_TRACKING_URI)",
        )
        return False
    return True


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _experiment_id(client: Any) -> str:
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "prefect-gliner2"
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))


def find_run(client: Any, run_key: str, fingerprint: str | None = None) -> Any:
    """The newest MLflow run of `run_key` (and plan `fingerprint`, when given) in the experiment, or None."""
    query = f"tags.`{RUN_KEY_TAG}` = '{_quoted(run_key)}'"
    if fingerprint:
        query += f" and tags.`{FINGERPRINT_TAG}` = '{_quoted(fingerprint)}'"
    runs = client.search_runs([_experiment_id(client)], filter_string=query, order_by=["start_time DESC"])
    return runs[0] if runs else None


class MlflowRun:
    """One run key's MLflow run, written in order from a background thread (training never waits for MLflow)."""

    def __init__(
        self,
        run_key: str,
        fingerprint: str,
        params: dict[str, Any],
        flow_run_id: str | None = None,
        pyfunc: PyfuncModel | None = None,
    ) -> None:
        """`pyfunc`: the flavour arguments an export is logged with (``runtime.mlflow_model.pyfunc_model``); None:
        the export is only named in a tag."""
        self.run_key, self.fingerprint, self.params, self.flow_run_id = run_key, fingerprint, params, flow_run_id
        self.pyfunc = pyfunc
        self.run_id: str | None = None
        self.logged_step = self.logged_eval = -1  # the last steps MLflow holds (a resumed run logs past them)
        self._jobs: queue.Queue[Callable[[Any], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="gliner2-mlflow", daemon=True)
        self._thread.start()

    # ---- what the run reports (queued) ---------------------------------------------------------------------

    def start(self, history: Iterable[dict[str, Any]] = (), validations: Iterable[dict[str, Any]] = ()) -> None:
        """Open (or find again) the MLflow run, log its parameters and the history recorded so far."""
        self._jobs.put(self._open)
        self.steps(history)
        for entry in validations:
            self.validation(entry)

    def steps(self, updates: Iterable[dict[str, Any]]) -> None:
        """Per-update metrics (the worker's training history entries), logged at their step."""
        entries = [dict(entry) for entry in updates]
        if entries:
            self._jobs.put(lambda client: self._log_steps(client, entries))

    def validation(self, metrics: dict[str, Any]) -> None:
        """A validation's metrics (micro and macro, per kind, fitted; per label F1 as ``eval_f1/<label>`` and, at the
        fitted thresholds, ``eval_f1_fitted/<label>``), at its step."""
        entry = dict(metrics)
        self._jobs.put(lambda client: self._log_validation(client, entry))

    def finish(self, export_uri: str | None, summary: dict[str, Any]) -> None:
        """Log the exported model (the run's logged model) and the outcome; the MLflow run ends FINISHED."""
        self._jobs.put(lambda client: self._finish(client, export_uri, summary))

    def close(self, timeout: float = 120.0, *, failed: bool = False) -> bool:
        """Finish queued jobs (at most `timeout` s); a `failed` run ends FAILED (its resume reopens it)."""
        if failed:
            self._jobs.put(lambda client: client.set_terminated(self.run_id, status="FAILED"))
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the background thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Run the jobs in order; after an error (the client has retried it already) the rest are dropped: a
        resumed run of the run key logs again from where the server stands."""
        client, broken = None, False
        while (job := self._jobs.get()) is not None:
            if broken:
                continue
            try:
                client = client or _client()
                if self.run_id is not None or job == self._open:
                    job(client)
            except Exception as exc:  # noqa: BLE001 - MLflow must never fail a training run
                broken = True
                logger.warning("MLflow logging of run %s stopped after an error: %s", self.run_key, exc)

    def _open(self, client: Any) -> None:
        found = find_run(client, self.run_key, self.fingerprint)
        flow_run = {FLOW_RUN_TAG: self.flow_run_id} if self.flow_run_id else {}
        if found is None:
            tags = {RUN_KEY_TAG: self.run_key, FINGERPRINT_TAG: self.fingerprint, **flow_run}
            run = client.create_run(_experiment_id(client), run_name=self.run_key, tags=tags)
            self.run_id = run.info.run_id
            self._log_params(client)
            return
        self.run_id = found.info.run_id
        client.update_run(self.run_id, status="RUNNING")
        for key, value in flow_run.items():  # the flow run that continues it
            client.set_tag(self.run_id, key, value)
        self.logged_step = _last_step(client, self.run_id, "loss")
        self.logged_eval = _last_step(client, self.run_id, "eval_loss")
        if not found.data.params:
            self._log_params(client)

    def _log_params(self, client: Any) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:6000]) for key, value in sorted(self.params.items())]
        for first in range(0, len(params), 100):
            client.log_batch(self.run_id, params=params[first : first + 100])

    def _log_steps(self, client: Any, entries: list[dict[str, Any]]) -> None:
        fresh = [e for e in entries if int(e["step"]) > self.logged_step]
        metrics = [m for e in fresh for m in _metrics(e, int(e["step"]), skip=("step", "batch"))]
        self._log(client, metrics)
        if fresh:
            self.logged_step = max(int(e["step"]) for e in fresh)

    def _log_validation(self, client: Any, entry: dict[str, Any]) -> None:
        step = int(entry["step"])
        if step <= self.logged_eval:
            return
        metrics = _metrics(entry, step, skip=("step", "batch", "epoch"))
        for key, rows in (("eval_f1", entry.get("per_label")), ("eval_f1_fitted", entry.get("per_label_fitted"))):
            for row in rows or []:
                name = row["label"] if row.get("kind") == "entities" else f"{row.get('kind')}/{row['label']}"
                metrics += _metrics({f"{key}/{name}": row.get("f1")}, step)
        self._log(client, metrics)
        self.logged_eval = step

    def _log(self, client: Any, metrics: list[Any]) -> None:
        for first in range(0, len(metrics), BATCH):
            client.log_batch(self.run_id, metrics=metrics[first : first + BATCH])

    def _finish(self, client: Any, export_uri: str | None, summary: dict[str, Any]) -> None:
        if export_uri:
            if self.pyfunc is not None:
                self._log_model(client, export_uri, self.pyfunc)
            client.set_tag(self.run_id, "prefect-gliner2.export", export_uri)
        for key in ("best_metric", "best_step", "total_steps"):
            if isinstance(summary.get(key), (int, float)) and not isinstance(summary.get(key), bool):
                client.set_tag(self.run_id, f"prefect-gliner2.{key}", str(summary[key]))
        client.set_terminated(self.run_id, status="FINISHED")

    def _log_model(self, client: Any, export_uri: str, pyfunc: PyfuncModel) -> None:
        """The export as the run's logged model; a missing dependency is a warning and the run still finishes."""
        tags = {RUN_KEY_TAG: self.run_key, FINGERPRINT_TAG: self.fingerprint}
        origin = {"run_key": self.run_key, "base_model": self.params.get("model")}
        params = {key: value for key, value in origin.items() if value is not None}
        try:
            log_export(client, client.get_run(self.run_id), export_uri, self.run_key, tags, params, pyfunc)
        except ImportError as exc:
            logger.warning(
                "the model of run %s is not logged to MLflow: %s (pip install 'prefect-gliner2[mlflow]')",
                self.run_key,
                exc,
            )


def mirror_promotion(registry: Any, version: Any) -> None:
    """Mirror a promotion: registry `version` (a ``ModelVersion``) as a version of the registered MLflow model of
    the same name, made from its training run's logged model, with the alias ``champion``. Nothing when MLflow is
    off; a warning when it fails or the training run (or its logged model) is not in MLflow."""
    if not enabled():
        return

    def mirror() -> None:
        try:
            _mirror(_client(), registry.name, version)
        except Exception as exc:  # noqa: BLE001 - the registry's own promotion stands; MLflow is a mirror
            logger.warning("could not mirror the promotion of %s %s to MLflow: %s", registry.name, version.version, exc)

    # bounded: an unreachable server (the client retries for minutes) never holds a promotion
    thread = threading.Thread(target=mirror, name="gliner2-mlflow-promotion", daemon=True)
    thread.start()
    thread.join(MIRROR_TIMEOUT)
    if thread.is_alive():
        logger.warning(
            "MLflow did not answer within %s s: %s %s is mirrored in the background if it answers later",
            MIRROR_TIMEOUT,
            registry.name,
            version.version,
        )


def _mirror(client: Any, name: str, version: Any) -> None:
    run_key = version.lineage.get("run_key")
    run = find_run(client, run_key) if run_key else None
    if run is None:
        logger.warning(
            "%s %s: its training run %s is not in MLflow; no model version made", name, version.version, run_key
        )
        return
    weights = export_info(version.uri).get("weights_sha256")
    logged = find_logged_model(client, run.info.experiment_id, run.info.run_id, weights)
    if logged is None:
        logger.warning(
            "%s %s: its training run %s has no logged model%s in MLflow; no model version made",
            name,
            version.version,
            run_key,
            f" with weights {weights}" if weights else "",
        )
        return
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, tags={"prefect-gliner2.registry": version.uri.rsplit("/versions/", 1)[0]})
    query = f"name = '{_quoted(name)}' and tags.`{VERSION_TAG}` = '{_quoted(version.version)}'"
    existing = client.search_model_versions(query)
    if existing:
        model_version = existing[0]
    else:
        tags = {VERSION_TAG: version.version, "prefect-gliner2.uri": version.uri}
        model_version = client.create_model_version(
            name, f"models:/{logged.model_id}", run_id=run.info.run_id, tags=tags, model_id=logged.model_id
        )
    client.set_registered_model_alias(name, CHAMPION, str(model_version.version))


def _metrics(values: dict[str, Any], step: int, skip: tuple[str, ...] = ()) -> list[Any]:
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    return [
        Metric(_metric_key(key), float(value), stamp, step)
        for key, value in values.items()
        if key not in skip and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


def _metric_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)


def _last_step(client: Any, run_id: str, key: str) -> int:
    history = client.get_metric_history(run_id, key)
    return max((int(m.step) for m in history), default=-1)


def _quoted(value: str) -> str:
    return str(value).replace("'", "\\'")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)
