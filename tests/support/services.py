"""Real services on loopback for the tests: an S3 API server (moto in server mode) and a PostgreSQL cluster.

    (registered as fixtures in tests/conftest.py: s3_endpoint, s3_bucket, postgres_url)

``s3_server`` starts ``moto.server`` in its own process on a free loopback port, creates a fresh bucket and points
every S3 client of this process and its children at it (``AWS_ENDPOINT_URL_S3`` plus fsspec's s3 config); it
yields the bucket's ``s3://`` URL. ``postgres_url`` runs ``initdb`` into a temporary directory and ``pg_ctl start``
on a free port (as the ``postgres`` user when the suite runs as root: PostgreSQL refuses to run as root) and yields
an asyncpg SQLAlchemy URL for ``PREFECT_API_DATABASE_CONNECTION_URL``. Both stop their process at session end.
PostgreSQL comes from Debian's packages (``make postgres``); without ``initdb`` the fixture fails and says so.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before answering at {url}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{process.args!r} did not answer at {url} within {timeout} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---- S3 --------------------------------------------------------------------------------------------------------


def point_s3_clients_at(endpoint: str) -> None:
    """This process and every child it starts: S3 requests go to `endpoint` with the test credentials."""
    os.environ.update(S3_ENV)
    os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
    os.environ["FSSPEC_S3_ENDPOINT_URL"] = endpoint  # read by fsspec at import in child processes
    import fsspec.config

    fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = endpoint


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 API server on a free loopback port (its own process), stopped at session end."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, **S3_ENV),
    )
    try:
        _wait_http(f"{endpoint}/moto-api/", process, timeout=60)
        point_s3_clients_at(endpoint)
        yield endpoint
    finally:
        _stop(process)


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket on the session's S3 server; returns ``s3://<bucket>``."""
    import s3fs

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"


# ---- PostgreSQL ------------------------------------------------------------------------------------------------


def postgres_bin(name: str) -> str:
    """Path of a PostgreSQL server program (PATH, else Debian's /usr/lib/postgresql/<version>/bin)."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run `make postgres` (Debian's postgresql package)")
    return found


def _as_postgres_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl on a free port); yields a postgresql+asyncpg:// URL."""
    data = tempfile.mkdtemp(prefix="pg-data-")
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    port = free_port()
    initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
    subprocess.run(
        _as_postgres_user([initdb, "-D", data, "-U", "prefect", "--auth=trust", "-E", "UTF8"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
    subprocess.run(
        _as_postgres_user([pg_ctl, "-D", data, "-o", options, "-l", f"{data}/server.log", "-w", "start"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            _as_postgres_user(
                [postgres_bin("createdb"), "-h", "127.0.0.1", "-p", f"{port}", "-U", "prefect", "prefect"]
            ),
            check=True,
        )
        yield f"postgresql+asyncpg://prefect@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run(_as_postgres_user([pg_ctl, "-D", data, "-m", "immediate", "stop"]), check=False)
        shutil.rmtree(data, ignore_errors=True)


def fresh_database(url: str) -> str:
    """A new, empty database on the cluster of `url` (a ``postgres_url``): one per Prefect server, so two servers of
    one session (two modules' fixtures) do not see each other's work pools, deployments and automations."""
    host_port = url.rsplit("@", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    name = f"prefect_{uuid.uuid4().hex[:12]}"
    subprocess.run(
        _as_postgres_user([postgres_bin("createdb"), "-h", host, "-p", port, "-U", "prefect", name]), check=True
    )
    return f"{url.rsplit('/', 1)[0]}/{name}"
