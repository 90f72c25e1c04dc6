"""Remake the docs' MLflow screenshots from a real run: a short run on the demo's data, logged to a throwaway
``mlflow server`` (SQLite, on loopback), its MLflow run page in headless Chromium.

    .venv/bin/python docs/mlflow_screenshot.py [--epochs 4] [--out docs]

Writes ``mlflow-run.png`` (the run's overview: status, tags, metrics). Needs the test extra (``mlflow``) and
Debian's ``chromium``; a few minutes on two cores (33 min at a load average of 10-37).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "docs")]

from screenshots import _shoot  # noqa: E402

from prefect_gliner2.flows.demo import DEMO_CONFIG, DEMO_MODEL, write_demo_inputs  # noqa: E402

from support.mlflow_server import mlflow_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium not found: install Debian's chromium package (apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="gliner2-mlflow-shots-"))
    try:
        with mlflow_server() as server:
            paths = write_demo_inputs(str(work / "demo"))
            config = {**DEMO_CONFIG, "num_epochs": args.epochs}
            Path(paths["config"]).write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
            env = dict(
                os.environ,
                PREFECT_HOME=str(work / "home"),
                MLFLOW_TRACKING_URI=server.uri,
                MLFLOW_EXPERIMENT_NAME="prefect-gliner2-demo",
                PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
            )
            env.pop("PREFECT_API_URL", None)
            command = [str(Path(sys.executable).parent / "prefect-gliner2"), "train", "--model", DEMO_MODEL]
            command += ["--train", paths["train"], "--valid", paths["valid"], "--config", paths["config"]]
            command += ["--run-key", "mlflow-demo", "--storage", str(work / "runs")]
            subprocess.run(command, env=env, check=True)
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=server.uri)
            experiment = client.get_experiment_by_name("prefect-gliner2-demo")
            [run] = client.search_runs([experiment.experiment_id])
            page = f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
            out = Path(args.out)
            _shoot(browser, page, out / "mlflow-run.png", work)
            print(f"MLflow run {run.info.run_id}: screenshots in {out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
