"""Every Prefect API write of run reporting: the background lane that makes them, the per-run-key artifacts
updated in place, and the running flow run's position message.

A lane is one background thread with its own API client (the flow's closes when the flow ends, and a lane may still
be finishing its last jobs then) that names the flow run explicitly; it starts from an empty context plus a copy of
the flow's Prefect settings (which API to talk to), so no Prefect context variable is reset or overwritten. All
calls here are public client methods; what they rely on beyond their documented effect (the settings copy, the
busy-answer hook) is in ``flows/prefect_compat.py`` with the tests that pin it.

Busy servers: on SQLite, a write that reads first (the labels PATCH reads the run, then updates it) fails at once
when another write commits in between, and the server answers 503. Prefect's client then waits 2, 4, 8 ... s
before trying again, which held a finished run's last labels update for up to 30 s while the server was still
recording the run's task states. Prefect 3.9's client sleeps that back-off even with its retries set to 0 (it
sleeps after a retryable answer, then finds no attempt left). A lane made with ``own_retries`` therefore turns the
client's retries off *and* gives its HTTP client a response hook (httpx's public ``event_hooks``, passed through
``get_client(httpx_settings=...)``) that raises httpx's ``HTTPStatusError`` on a busy answer before the client's
retry loop sees it; its jobs' calls go through ``retry_busy``: again after 50 ms, doubling to at most 0.5 s, until
done or out of time.
"""

from __future__ import annotations

import contextvars
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect_gliner2.flows.prefect_compat import BUSY_STATUS, busy_client, thread_settings
from prefect_gliner2.flows.report_text import artifact_key, finite_or_none

__all__ = [
    "ArtifactSlots",
    "BusyRetrying",
    "Job",
    "Lane",
    "retry_busy",
    "run_logger",
]

logger = logging.getLogger(__name__)
Job = Callable[[Any], Any]  # called with the lane's SyncPrefectClient
ARTIFACT_TYPES = {"progress": "progress", "validation": "table"}  # anything else is markdown
#: Pauses between attempts of a call the server refused as busy (see the module docstring), the last one repeated.
BUSY_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.5)


class Lane:
    """One background thread running jobs in order with its own API client, under the creating thread's Prefect
    settings (and no other context). `own_retries` (seconds): the client's own retries are off and the jobs get a
    ``BusyRetrying`` client that tries each call for at most that long."""

    def __init__(self, name: str, run_key: str, *, own_retries: float | None = None) -> None:
        self.run_key = run_key
        self.own_retries = own_retries
        self.abandoned = False
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.settings = thread_settings()  # entered in the thread's own, empty context
        self.thread: threading.Thread | None = threading.Thread(
            target=contextvars.Context().run, args=(self._serve,), name=name, daemon=True
        )
        self.thread.start()

    def submit(self, job: Job) -> None:
        if self.thread is not None:
            self.jobs.put(job)

    def close(self, timeout: float) -> bool:
        """Finish queued jobs (waiting at most `timeout` s); True when they all ran."""
        if self.thread is None:
            return True
        self.jobs.put(None)
        self.thread.join(timeout)
        done = not self.thread.is_alive()
        self.thread = None
        self.abandoned = not done  # its remaining jobs may outlive the flow run (and its API server)
        return done

    def _serve(self) -> None:
        with self.settings, busy_client(own_retries=self.own_retries is not None) as client:
            self._run_jobs(client if self.own_retries is None else BusyRetrying(client, self.own_retries))

    def _run_jobs(self, client: Any) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                job(client)
            except Exception as exc:  # noqa: BLE001 - reporting must never fail a training run
                # after the run ended (an abandoned best-effort lane), the server may be gone: not worth a warning
                log = logger.debug if self.abandoned else logger.warning
                log("could not update the Prefect UI for run %s: %s", self.run_key, exc)


def retry_busy(call: Callable[[], Any], *, limit: float) -> Any:
    """`call()` (an API call), made again after a short pause (``BUSY_PAUSES``) while the server answers busy
    (``BUSY_STATUS``) or cannot be reached, for at most `limit` seconds; returns what it returns. The last error is
    raised when time runs out; any other error at once."""
    import httpx

    deadline = time.monotonic() + limit
    attempt = 0
    while True:
        try:
            return call()
        except (httpx.HTTPStatusError, httpx.TransportError) as exc:  # PrefectHTTPStatusError is an HTTPStatusError
            busy = not isinstance(exc, httpx.HTTPStatusError) or exc.response.status_code in BUSY_STATUS
            pause = BUSY_PAUSES[min(attempt, len(BUSY_PAUSES) - 1)]
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        attempt += 1


class BusyRetrying:
    """A client whose every method call goes through ``retry_busy`` (the client itself must not retry)."""

    def __init__(self, client: Any, limit: float) -> None:
        self._client, self._limit = client, limit

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: retry_busy(lambda: method(*args, **kwargs), limit=self._limit)


class ArtifactSlots:
    """A run key's artifacts (``progress``, ``validation``, ``summary``), each updated in place: a resumed run
    continues the ones its crashed run created. Used from one lane only."""

    def __init__(self, run_key: str, flow_run_id: str) -> None:
        self.run_key, self.flow_run_id = run_key, flow_run_id
        self.ids: dict[str, Any] = {}

    def upsert(self, client: Any, what: str, data: Any, description: str) -> None:
        """Update this run key's artifact `what` in place; create it (for this flow run, named explicitly: the
        lane has no run context) when the run key has none yet."""
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        key = artifact_key(self.run_key, what)
        if what not in self.ids:
            self.ids[what] = _latest_artifact_id(client, key)
        artifact_id = self.ids[what]
        stored = json.dumps(finite_or_none(data)) if what == "validation" else data
        if artifact_id is not None:
            client.update_artifact(artifact_id, ArtifactUpdate(data=stored, description=description))
            return
        request = ArtifactCreate(
            type=ARTIFACT_TYPES.get(what, "markdown"),
            key=key,
            description=description,
            data=stored,
            flow_run_id=UUID(self.flow_run_id),
        )
        self.ids[what] = client.create_artifact(artifact=request).id


def _latest_artifact_id(client: Any, key: str) -> Any:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
    )
    return found[0].id if found else None


def run_logger() -> Any:
    """The flow run's logger inside a run, this module's outside one."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logger
