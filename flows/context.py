"""What the run lifecycle asks the orchestrator, answered from Prefect: this flow run's id, whether a retry follows
a failure, whether a lease holder's flow run is gone, and the ``RunHooks`` that carry those answers to ``runtime.run``
(the run-context rules they rely on, and ``interrupts_surface``, are in ``flows/prefect_compat.py``).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from prefect_gliner2.flows.events import emit_failed
from prefect_gliner2.flows.prefect_compat import flow_run_id, interrupts_surface, retry_follows
from prefect_gliner2.runtime.run import RunHooks
from prefect_gliner2.runtime.rundir import RunDirectory

__all__ = ["FINAL_STATES", "holder_flow_run_gone", "interrupts_surface", "run_hooks"]

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


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
