"""One Prefect test server per pytest process, shared by the flow test modules (import the fixture explicitly).

    from _prefect_fixtures import prefect_server  # noqa: F401  (a fixture)

The server is started once (``prefect_test_harness``) and stopped at the end of the session. Each module that
imports the fixture gets its own session-scoped definition; they share the one server and the first teardown at
session end stops it. Flow-run heartbeats are
switched off in this process (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` cannot be unset from the environment): each
flow run would otherwise pay about a second joining its heartbeat thread. ``api_url()`` lets subprocess flows use
the same server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

_STATE: dict[str, Any] = {}


def _start() -> str:
    if "url" not in _STATE:
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        import prefect.settings as settings
        from prefect.settings import temporary_settings
        from prefect.testing.utilities import prefect_test_harness

        stack = contextlib.ExitStack()
        stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        stack.enter_context(temporary_settings(updates={settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        _STATE["stack"] = stack
        _STATE["url"] = str(settings.PREFECT_API_URL.value())
    return str(_STATE["url"])


def api_url() -> str:
    return _start()


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """The shared server's API URL; stopped at the end of the session (while output capture is still open)."""
    yield _start()
    _stop()


def _stop() -> None:
    stack = _STATE.pop("stack", None)
    _STATE.pop("url", None)
    if stack is not None:
        stack.close()
