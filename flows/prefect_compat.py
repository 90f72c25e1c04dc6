"""Every Prefect behaviour the product relies on beyond a documented API effect, in one module, each with its test.

``pyproject.toml`` admits ``prefect>=3.9.1,<3.10``: the suite runs on 3.9.1 only, and what follows is server or
engine behaviour a release may change. Admit a new version once the tests named here pass on it. Nothing private is
imported (no underscore module, class or field); the rules are about what public calls do. Prefect is imported inside
the functions, so the console script stays light until a command runs.

1. A position message without counting an attempt (``set_running_message``, ``propose_running_message``): a state
   message changes only with a new state, and every accepted Running state increments ``run_count`` (using up the
   flow's retries) unless the run's ``empirical_policy.resuming`` is set, Prefect's mechanism for resuming a paused
   run; the server clears the mark with that Running state and with any final state; a Cancelling run refuses
   Running (the mark is then taken back); Running to Running keeps the deployment concurrency slot.
   Pinned by ``tests/test_prefect_rules.py`` (each rule, and that an unmarked Running does count) and
   ``tests/test_ui_state.py`` (a real run ends with ``run_count`` 1).
2. A flow run retried in place as the UI's Retry button does (``retry_in_place``): an orchestrated ``AwaitingRetry``
   is accepted for a crashed or failed run of a deployment (a worker runs it again, ``run_count`` + 1) and refused
   for a run without one. Pinned by ``tests/test_prefect_rules.py``; ``tests/test_sweep.py`` end to end.
3. A Completed state's message only on a run's first attempt (``completed_state``): after an attempt failed in the
   same process, Prefect 3.9's engine answers a returned State with that attempt's exception. Worked around, not
   used. Pinned by ``tests/test_flow.py`` (a flow retry in process).
4. What the run context says (``flow_run_id``, ``flow_run_name``, ``retry_follows``): ``FlowRunContext.get()``, and
   ``run_count`` counting attempts from 1 against ``empirical_policy.retries``. Pinned by ``tests/test_flow.py``.
5. Interrupts (``interrupt_behind``, ``interrupts_surface``, ``signal_status``): Prefect 3.9's task engine handles a
   ``TerminationSignal`` that lands while it creates a task run as a crash of a task run that does not exist yet, and
   raises ``ValueError("Task run is not set")`` in its place; the flow run would end FAILED and the command with 1
   instead of CRASHED and 143. Pinned by ``tests/test_signal_in_task_creation.py`` (a real SIGTERM from inside task
   run creation) and ``tests/test_interrupts.py``.
6. Busy answers (``busy_client``, ``BUSY_STATUS``): Prefect 3.9's client sleeps its 2 s back-off after a 429/503 even
   with ``PREFECT_CLIENT_MAX_RETRIES`` 0; an exception raised in an httpx response hook (``event_hooks``, passed via
   ``get_client(httpx_settings=...)``) leaves its retry loop at once. Pinned by ``tests/test_busy_retry.py``.
7. Reporting threads (``thread_settings``): a copy of the flow's ``SettingsContext`` entered in another thread's
   fresh ``contextvars.Context`` selects the same API; no Prefect context variable is reset or overwritten. Pinned by
   ``tests/test_ui_state.py``.
8. A local server stopped cleanly (``drain_queued``): the logs and events still queued in this process are sent first
   (``APILogWorker.drain_all``, ``EventsWorker.drain_all``, as Prefect's own ``prefect_test_harness`` does); else they
   are retried against the closed port for minutes. Pinned by ``tests/test_interrupts.py`` and ``tests/test_cli.py``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from prefect_gliner2.runtime.errors import exception_chain

__all__ = [
    "BUSY_STATUS",
    "busy_client",
    "completed_state",
    "drain_queued",
    "flow_run_id",
    "flow_run_name",
    "interrupt_behind",
    "interrupts_surface",
    "propose_running_message",
    "retry_follows",
    "retry_in_place",
    "set_running_message",
    "signal_status",
    "thread_settings",
]

#: Answers that mean "busy, try again": 503 (SQLite locked), 429 (rate limited).
BUSY_STATUS = (429, 503)


# ---- 1. a position message without counting an attempt ----------------------------------------------------------


def set_running_message(client: Any, flow_run_id: UUID, message: str) -> bool:
    """Show `message` as the running flow run's state message, without counting a new attempt; True when shown.

    Only while the run is Running: mark it resuming and propose Running with the message (rule 1). The
    read-then-propose window is milliseconds; a cancellation landing in it is refused the Running state (see
    ``propose_running_message``)."""
    from prefect.client.schemas.objects import StateType

    flow_run = client.read_flow_run(flow_run_id)
    state = flow_run.state
    if state is None or state.type != StateType.RUNNING or state.message == message:
        return False
    return propose_running_message(client, flow_run_id, flow_run.empirical_policy, message)


def propose_running_message(client: Any, flow_run_id: UUID, policy: Any, message: str) -> bool:
    """Mark the run resuming (its `policy` otherwise as read) and propose Running with `message`; when the server
    refuses (a Cancelling run may only become Cancelled) or the call fails, take the mark back. True when accepted."""
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Running

    client.update_flow_run(flow_run_id, empirical_policy=policy.model_copy(update={"resuming": True}))
    accepted = False
    try:
        accepted = client.set_flow_run_state(flow_run_id, Running(message=message)).status == SetStateStatus.ACCEPT
    finally:
        if not accepted:  # an accepted Running state cleared the mark on the server
            client.update_flow_run(flow_run_id, empirical_policy=policy.model_copy(update={"resuming": False}))
    return accepted


# ---- 2. a flow run retried in place -------------------------------------------------------------------------


def retry_in_place(flow_run_id: UUID, message: str) -> tuple[bool, str | None]:
    """Propose an orchestrated AwaitingRetry for a crashed or failed flow run, as the UI's Retry button does (rule 2):
    (True, None) when accepted, else (False, the server's reason)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import AwaitingRetry

    with get_client(sync_client=True) as client:
        result: Any = client.set_flow_run_state(flow_run_id, AwaitingRetry(message=message))
    if result.status != SetStateStatus.ACCEPT:
        return False, f"{result.status}: {getattr(result.details, 'reason', None)}"
    return True, None


# ---- 3. a Completed state's message -------------------------------------------------------------------------


def completed_state(message: str, summary: dict[str, Any]) -> Any:
    """What a flow returns to end in a Completed state whose message is `message` (callers receive `summary`):
    that state on a run's first attempt, `summary` itself on a later one (rule 3)."""
    from prefect.context import FlowRunContext
    from prefect.states import Completed

    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow_run.run_count > 1:
        return summary
    return Completed(message=message, data=summary)


# ---- 4. what the run context says ---------------------------------------------------------------------------


def _flow_run() -> Any:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context.flow_run if context is not None else None


def flow_run_id() -> str | None:
    """The id of the flow run this code runs in, None outside one."""
    flow_run = _flow_run()
    return str(flow_run.id) if flow_run is not None else None


def flow_run_name() -> tuple[str | None, dict[str, Any]]:
    """The current flow run's name and labels (None and {} outside a flow run)."""
    flow_run = _flow_run()
    return (flow_run.name, dict(flow_run.labels or {})) if flow_run is not None else (None, {})


def retry_follows() -> bool:
    """Whether Prefect will retry this flow run after this attempt fails (flow retries left; rule 4)."""
    flow_run = _flow_run()
    if flow_run is None:
        return False
    retries = flow_run.empirical_policy.retries or 0
    return bool(flow_run.run_count <= retries)


# ---- 5. interrupts ------------------------------------------------------------------------------------------


def _termination_signal() -> type[BaseException] | None:
    """Prefect's TerminationSignal when Prefect is loaded (never imported just to ask)."""
    if "prefect.exceptions" not in sys.modules:
        return None
    from prefect.exceptions import TerminationSignal

    return TerminationSignal


def interrupt_behind(exc: BaseException) -> BaseException | None:
    """The Ctrl-C (``KeyboardInterrupt``) or SIGTERM (Prefect's ``TerminationSignal``) that `exc` is, or was raised
    from or while handling, else None."""
    termination = _termination_signal()
    for linked in exception_chain(exc):
        if isinstance(linked, KeyboardInterrupt) or (termination is not None and isinstance(linked, termination)):
            return linked
    return None


def signal_status(exc: BaseException) -> int | None:
    """128 + the signal of Prefect's ``TerminationSignal``, None for anything else."""
    termination = _termination_signal()
    if termination is not None and isinstance(exc, termination):
        return 128 + int(exc.signal)  # type: ignore[attr-defined]
    return None


@contextlib.contextmanager
def interrupts_surface() -> Iterator[None]:
    """Around a flow's body: an exception raised while Prefect handled a Ctrl-C or SIGTERM is raised as that
    interrupt again, so the flow run ends CRASHED (and the console script exits with 130 / 143), not FAILED
    (rule 5)."""
    try:
        yield
    except Exception as exc:
        found = interrupt_behind(exc)
        if isinstance(found, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        if found is not None:
            raise type(found)(found.signal) from exc  # type: ignore[attr-defined]
        raise


# ---- 6. busy answers ----------------------------------------------------------------------------------------


def _raise_busy(response: Any) -> None:
    """A response hook: a busy answer (``BUSY_STATUS``) raises httpx's HTTPStatusError at once, so that Prefect's
    client does not sleep its own back-off first (rule 6)."""
    if response.status_code in BUSY_STATUS:
        import httpx

        request = response.request
        raise httpx.HTTPStatusError(
            f"{request.method} {request.url.path}: {response.status_code} (server busy)",
            request=request,
            response=response,
        )


@contextlib.contextmanager
def busy_client(*, own_retries: bool) -> Iterator[Any]:
    """A synchronous API client; with `own_retries`, its own retries are off and a busy answer raises at once
    (the caller retries it: ``prefect_ui.retry_busy``)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with contextlib.ExitStack() as stack:
        if own_retries:
            stack.enter_context(temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}))
        hooks = {"event_hooks": {"response": [_raise_busy]}} if own_retries else None
        yield stack.enter_context(get_client(httpx_settings=hooks, sync_client=True))


# ---- 7. reporting threads -----------------------------------------------------------------------------------


def thread_settings() -> Any:
    """A copy of this thread's Prefect settings context, to enter in another thread's fresh context (rule 7)."""
    from prefect.context import get_settings_context

    return get_settings_context().model_copy()


# ---- 8. a local server stopped cleanly ----------------------------------------------------------------------


def drain_queued(timeout: float = 3.0) -> None:
    """Send the logs and events still queued in this process before the server stops (rule 8)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout)
