"""A local Prefect test server with flow-run heartbeats off: the ``prefect_server`` fixture and the chaos CLI use it.

The server is ``prefect_test_harness`` (SQLite, loopback). Flow-run heartbeats are switched off in this process
(``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` cannot be unset from the environment): each flow run would otherwise pay
about a second joining its heartbeat thread. Subprocess flows reach the same server through the yielded API URL
(``PREFECT_API_URL``). The server writes the events it receives every 0.5 s instead of every 5 s (Prefect's
default): a test that reads a run's events back waits for that write.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["delete_deployments", "local_prefect_server"]


@contextlib.contextmanager
def local_prefect_server() -> Iterator[str]:
    """Start a throwaway Prefect server for this process, yield its API URL, stop it on exit."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import prefect.settings as settings
    from prefect.settings import temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with (
        temporary_settings(  # before the server starts: it takes its settings from this process's
            updates={
                settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
                settings.PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL: 0.5,
            }
        ),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield str(settings.PREFECT_API_URL.value())


def delete_deployments(*names: str) -> None:
    """Delete the named deployments ("flow/deployment") from the current API, if they exist (served deployments
    must not inherit a work-pool deployment of the same name and its pull steps)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except ObjectNotFound:
                pass
