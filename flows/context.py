"""What the run lifecycle asks the orchestrator, answered from Prefect: this flow run's id, whether a retry follows
a failure, whether a lease holder's flow run is gone, and the ``RunHooks`` that carry those answers to ``runtime.run``;
and ``interrupts_surface()``, which keeps a Ctrl-C or SIGTERM an interrupt when Prefect's own handling of it fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect import get_run_logger
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal

from prefect_gliner2.flows.events import emit_failed
from prefect_gliner2.runtime.errors import exception_chain
from prefect_gliner2.runtime.run import RunHooks
from prefect_gliner2.runtime.rundir import RunDirectory

__all__ = [
    "FINAL_STATES",
    "flow_run_id",
    "holder_flow_run_gone",
    "interrupt_behind",
    "interrupts_surface",
    "retry_follows",
    "run_hooks",
]

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def flow_run_id() -> str | None:
    """The id of the flow run this code runs in, None outside one."""
    context = FlowRunContext.get()
    return str(context.flow_run.id) if context is not None and context.flow_run is not None else None


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | TerminationSignal | None:
    """The Ctrl-C (``KeyboardInterrupt``) or SIGTERM (Prefect's ``TerminationSignal``) that `exc` is, or was raised
    from or while handling, else None."""
    for linked in exception_chain(exc):
        if isinstance(linked, (KeyboardInterrupt, TerminationSignal)):
            return linked
    return None


@contextlib.contextmanager
def interrupts_surface() -> Iterator[None]:
    """Around a flow's body: an exception raised while Prefect handled a Ctrl-C or SIGTERM is raised as that
    interrupt again, so the flow run ends CRASHED (and the console script exits with 130 / 143), not FAILED.

    Why: Prefect 3.9's task engine records a ``TerminationSignal`` that arrives while it creates a task run as a
    crash of that task run, which does not exist yet; its crash handler then raises ``ValueError("Task run is not
    set")`` in place of the signal (seen in CI: a SIGTERM during a checkpoint task's creation ended the flow run
    FAILED and the command with 1).
    """
    try:
        yield
    except Exception as exc:
        found = interrupt_behind(exc)
        if isinstance(found, TerminationSignal):
            raise TerminationSignal(found.signal) from exc
        if isinstance(found, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        raise


def retry_follows() -> bool:
    """Whether Prefect will retry this flow run after this attempt fails (flow retries left)."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return False
    retries = context.flow_run.empirical_policy.retries or 0
    return context.flow_run.run_count <= retries


def holder_flow_run_gone(claim: dict[str, Any]) -> str | None:
    """Why a lease holder's flow run provably no longer runs (final or CRASHED per the Prefect API), else None."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    holder = claim.get("flow_run_id")
    if not holder:
        return None
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(str(holder))).state
    except (ObjectNotFound, ValueError):
        return None  # not provable from here: wait for the TTL
    except Exception as exc:  # noqa: BLE001 - an unreachable API proves nothing: the TTL decides
        get_run_logger().warning("cannot ask Prefect about lease holder %s (%s); waiting for its TTL", holder, exc)
        return None
    if state is not None and state.type.value in FINAL_STATES:
        return f"its flow run {holder} is {state.name} per the Prefect API"
    return None


def run_hooks() -> RunHooks:
    """The lifecycle's hooks inside a flow run: its id, Prefect's retry policy, the API's word on lease holders,
    the run logger, and a run.failed event when the run fails for good."""
    current = flow_run_id()

    def failed(run_dir: RunDirectory, exc: BaseException) -> None:
        emit_failed(run_dir, current, exc)

    return RunHooks(
        flow_run_id=current,
        retry_follows=retry_follows,
        holder_gone=holder_flow_run_gone,
        on_failed=failed,
        logger=get_run_logger(),
    )
