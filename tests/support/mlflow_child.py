"""Log an export as a training run's MLflow model the way the product does (``MlflowRun`` with the pyfunc
flavour), then load it back by its ``models:/`` URI and extract: run under ``support.extra_only mlflow`` it shows
that the ``mlflow`` extra (mlflow-skinny) is all a user needs on the client side.

    python -m support.extra_only mlflow support.mlflow_child RUN_KEY EXPORT TEXTS_JSON

Uses MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME from the environment; prints
``{"model_uri": ..., "predictions": [...]}`` as its last line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def main(args: Sequence[str]) -> None:
    run_key, export, texts = args[0], args[1], json.loads(args[2])
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    from prefect_gliner2.model_registry import mlflow_sync
    from prefect_gliner2.model_registry.mlflow_logged_model import find_logged_model
    from prefect_gliner2.runtime.mlflow_model import pyfunc_model

    run = mlflow_sync.MlflowRun(run_key, "0" * 64, {"run_key": run_key}, pyfunc=pyfunc_model)
    run.start([{"step": 1, "loss": 1.0}])
    run.finish(export, {"total_steps": 1})
    assert run.close(600), "the MLflow logging did not finish"
    client = MlflowClient()
    found = mlflow_sync.find_run(client, run_key)
    assert found is not None and found.info.status == "FINISHED", found
    logged = find_logged_model(client, found.info.experiment_id, found.info.run_id)
    assert logged is not None, "no logged model (see the warning above)"
    model = mlflow.pyfunc.load_model(f"models:/{logged.model_id}")
    print(json.dumps({"model_uri": f"models:/{logged.model_id}", "predictions": model.predict(texts)}))
