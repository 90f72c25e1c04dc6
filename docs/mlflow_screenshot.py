"""Remake the docs' MLflow screenshots from a real run: a short run on the demo's data, logged to a throwaway
``mlflow server`` (SQLite, on loopback), its export registered and promoted in a model registry (so MLflow gets a
model version with the alias ``champion``), and MLflow's pages in headless Chromium, in its model-training view.

    .venv/bin/python docs/mlflow_screenshot.py [--epochs 3] [--out docs]

Writes ``mlflow-run.png`` (the run: status, tags, metrics, parameters, its logged model) and ``mlflow-model.png``
(the logged model: its model version, the metrics of its step, its thresholds and schema as parameters). Needs the
test extra (``mlflow``) and Debian's ``chromium``; a few minutes on two cores (33 min at a load average of 10-37).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "docs")]

from screenshots import _shoot  # noqa: E402

from prefect_gliner2.flows.demo import DEMO_CONFIG, DEMO_MODEL, write_demo_inputs  # noqa: E402

from support.mlflow_server import mlflow_server  # noqa: E402
from support.services import free_port  # noqa: E402

VIEW = "workflowType=machine_learning"  # MLflow's model-training view (its UI opens in the GenAI one)
NAME = "ner-demo"  # the registry model, and MLflow's registered model
EXPERIMENT = "prefect-gliner2-demo"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium not found: install Debian's chromium package (apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="gliner2-mlflow-shots-"))
    try:
        with mlflow_server() as server:
            export = _train(server.uri, args.epochs, work)
            from mlflow.tracking import MlflowClient

            from prefect_gliner2.model_registry import ModelRegistry

            # the promotion's MLflow mirror finds the training run in the run's experiment
            os.environ.update(MLFLOW_TRACKING_URI=server.uri, MLFLOW_EXPERIMENT_NAME=EXPERIMENT)
            registry = ModelRegistry(str(work / "registry"), NAME)
            registry.promote(registry.register(export, {"run_key": "mlflow-demo"}).version)
            client = MlflowClient(tracking_uri=server.uri)
            experiment = client.get_experiment_by_name(EXPERIMENT)
            [run] = client.search_runs([experiment.experiment_id])
            [logged] = run.outputs.model_outputs
            base = f"{server.uri}/#/experiments/{experiment.experiment_id}"
            _close_assistant(browser, f"{base}/runs/{run.info.run_id}?{VIEW}", work)
            out = Path(args.out)
            _shoot(browser, f"{base}/runs/{run.info.run_id}?{VIEW}", out / "mlflow-run.png", work, "1440,2000")
            _shoot(browser, f"{base}/models/{logged.model_id}?{VIEW}", out / "mlflow-model.png", work, "1440,1500")
            print(f"MLflow run {run.info.run_id}, logged model {logged.model_id}: screenshots in {out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _train(uri: str, epochs: int, work: Path) -> str:
    """`prefect-gliner2 train` on the demo's data, logged to MLflow at `uri`; returns the export."""
    paths = write_demo_inputs(str(work / "demo"))
    config = {**DEMO_CONFIG, "num_epochs": epochs}
    Path(paths["config"]).write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    env = dict(
        os.environ,
        PREFECT_HOME=str(work / "home"),
        MLFLOW_TRACKING_URI=uri,
        MLFLOW_EXPERIMENT_NAME=EXPERIMENT,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
    )
    env.pop("PREFECT_API_URL", None)
    command = [str(Path(sys.executable).parent / "prefect-gliner2"), "train", "--model", DEMO_MODEL]
    command += ["--train", paths["train"], "--valid", paths["valid"], "--config", paths["config"]]
    command += ["--run-key", "mlflow-demo", "--storage", str(work / "runs")]
    subprocess.run(command, env=env, check=True)
    return str(work / "runs" / "mlflow-demo" / "export")


def _close_assistant(browser: str, url: str, work: Path) -> None:
    """Close MLflow's assistant panel (it opens by itself on a first visit) in the profile the shots use: Chromium
    with its DevTools protocol on a free loopback port, the panel's close button clicked, the browser closed (its
    local storage, where MLflow keeps the panel's state, written)."""
    from websockets.sync.client import connect

    port = free_port()
    process = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={work / 'chromium'}"]
        + [f"--remote-debugging-port={port}", "--remote-allow-origins=*", "--window-size=1440,1100", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        page = _devtools_page(port)
        with connect(page["webSocketDebuggerUrl"], max_size=None) as socket:
            click = "(b => b ? (b.click(), true) : false)(document.querySelector('[aria-label=\"Close\"]'))"
            deadline = time.monotonic() + 120
            while not _evaluate(socket, click):
                if time.monotonic() > deadline:
                    raise RuntimeError("MLflow's assistant panel never showed its close button")
                time.sleep(1)
            time.sleep(2)
            socket.send(json.dumps({"id": 99, "method": "Browser.close"}))
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()


def _devtools_page(port: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                pages = [target for target in json.loads(response.read()) if target.get("type") == "page"]
            if pages:
                return dict(pages[0])
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Chromium's DevTools never answered on port {port}")
        time.sleep(0.5)


def _evaluate(socket: Any, expression: str) -> Any:
    socket.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {"expression": expression}}))
    while True:
        message = json.loads(socket.recv())
        if message.get("id") == 1:
            return message.get("result", {}).get("result", {}).get("value")


if __name__ == "__main__":
    raise SystemExit(main())
