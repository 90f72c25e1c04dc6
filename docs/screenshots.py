"""Remake the docs' UI screenshots from a real run: the demo on a loopback `prefect server start`, headless Chromium.

    .venv/bin/python docs/screenshots.py [--port 4399] [--out docs]

Starts a throwaway Prefect server (its own PREFECT_HOME, the API URL set before the server starts so the UI talks
to that port), runs ``prefect-gliner2 demo`` against it in a temporary directory, and screenshots the flow run
page (``run-page.png``), the validation table artifact (``validation-table.png``) and the training curves artifact
(``curves.png``, a taller window) with Debian's ``chromium``.
Needs ``chromium`` on PATH; about two minutes on two cores.
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

ROOT = Path(__file__).resolve().parents[1]
WINDOW = "1440,1100"
TALL = "1440,1200"  # the three charts of the curves artifact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4399)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium not found: install Debian's chromium package (apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="gliner2-shots-"))
    api = f"http://127.0.0.1:{args.port}/api"
    env = dict(os.environ, PREFECT_HOME=str(work / "home"), PREFECT_API_URL=api, PREFECT_UI_API_URL=api)
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen(
        [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(args.port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_healthy(api)
        subprocess.run([str(bin_dir / "prefect-gliner2"), "demo", "--dir", str(work / "demo")], env=env, check=True)
        flow_run = _post(api, "/flow_runs/filter", {"limit": 1, "sort": "START_TIME_DESC"})[0]
        artifacts = _post(api, "/artifacts/filter", {"artifacts": {"key": {"any_": ["gliner2-demo-validation"]}}})
        curves = _post(api, "/artifacts/filter", {"artifacts": {"key": {"any_": ["gliner2-demo-curves"]}}})
        out = Path(args.out)
        _shoot(browser, f"http://127.0.0.1:{args.port}/runs/flow-run/{flow_run['id']}", out / "run-page.png", work)
        _shoot(
            browser,
            f"http://127.0.0.1:{args.port}/artifacts/artifact/{artifacts[0]['id']}",
            out / "validation-table.png",
            work,
        )
        url = f"http://127.0.0.1:{args.port}/artifacts/artifact/{curves[0]['id']}"
        _shoot(browser, url, out / "curves.png", work, window=TALL)
        print(f"flow run {flow_run['name']}: screenshots in {out}")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _wait_healthy(api: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _post(api: str, path: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        f"{api}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _shoot(browser: str, url: str, path: Path, work: Path, window: str = WINDOW) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={work / 'chromium'}",
            f"--window-size={window}",
            "--virtual-time-budget=20000",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=180,
    )


if __name__ == "__main__":
    raise SystemExit(main())
