"""A tuning trial's training run, one segment at a time: to its next pause point (or its end), as a subflow in this
process or as a flow run of the training deployment on the fleet.

    launcher = InProcess() if deployment is None else OnDeployment(deployment, study_key, poll_seconds=5, retries=2)
    launcher.start(segment)                     # in process: returns once the segment ended
    for segment in launcher.wait(active): ...   # the segments whose flow run is final

On the fleet, a segment's flow run has the idempotency key ``<study_key>/<run_key>/<pause point or "end">``: a study
restarted after a kill gets the flow runs it already created back from the server (still running, or done) instead
of starting them again. A segment whose flow run crashed is retried in place (the same flow run, the same run key,
an exact resume from its checkpoint; ``prefect_compat.retry_in_place``), at most `retries` times. What a segment
trained is read from its run directory afterwards (``runtime.pause.run_outcome``), so no result persistence is
needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger

from prefect_gliner2.flows.prefect_compat import retry_in_place
from prefect_gliner2.flows.sweep import FINAL

__all__ = ["InProcess", "OnDeployment", "Segment"]


@dataclass
class Segment:
    """One trial's run from where it stands to its next pause point (`budget` updates) or, with None, to its end."""

    number: int  # the trial
    run_key: str
    params: dict[str, Any]  # train_flow parameters (run_key included, pause_at_step not)
    budget: int | None
    flow_run_id: str | None = None
    state: str | None = None  # the flow run's final state type (None: not ended yet)
    error: str | None = None
    retries: int = 0
    flow_runs: list[str] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.state in FINAL


class InProcess:
    """Segments as subflows of this flow run, one at a time (``start`` returns once the segment ended)."""

    slots = 1

    def start(self, segment: Segment) -> None:
        from prefect_gliner2.flows.train import train_flow

        state = train_flow(**segment.params, pause_at_step=segment.budget, return_state=True)
        segment.flow_run_id = str(state.state_details.flow_run_id)
        segment.state = state.type.value
        if not state.is_completed():
            segment.error = str(state.result(raise_on_failure=False))

    def wait(self, active: list[Segment]) -> list[Segment]:
        return [segment for segment in active if segment.ended]


class OnDeployment:
    """Segments as flow runs of the training deployment, `slots` at once; ``wait`` polls until one ends."""

    def __init__(self, deployment: str, study_key: str, *, slots: int, poll_seconds: float, retries: int) -> None:
        self.deployment, self.study_key, self.slots = deployment, study_key, slots
        self.poll_seconds, self.retries = poll_seconds, retries

    def start(self, segment: Segment) -> None:
        from prefect.deployments import run_deployment

        point = "end" if segment.budget is None else str(segment.budget)
        run: Any = run_deployment(
            self.deployment,
            parameters={**segment.params, "pause_at_step": segment.budget},
            timeout=0,
            idempotency_key=f"{self.study_key}/{segment.run_key}/{point}",
            tags=["gliner2-tune", f"study:{self.study_key}", f"trial:{segment.number}"],
            flow_run_name=f"{segment.run_key}-{point}",
            as_subflow=False,
        )
        segment.flow_run_id, segment.state = str(run.id), None
        state = _state_type(run)
        if state in ("CRASHED", "FAILED"):  # an earlier attempt of the study left it so: resume it exactly
            get_run_logger().info("trial %d: retrying the %s flow run %s", segment.number, state, run.id)
            _retry(run.id)
        elif state in FINAL:
            self._ended(segment, run)

    def wait(self, active: list[Segment]) -> list[Segment]:
        while True:
            ended = [segment for segment in active if segment.ended]
            if ended:
                return ended
            time.sleep(self.poll_seconds)
            for segment in active:
                self._poll(segment)

    def _poll(self, segment: Segment) -> None:
        from uuid import UUID

        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(str(segment.flow_run_id)))
        state = _state_type(run)
        if state == "CRASHED" and segment.retries < self.retries:
            segment.retries += 1
            get_run_logger().info(
                "trial %d: flow run %s crashed; retry %d of %d resumes it exactly",
                segment.number,
                run.id,
                segment.retries,
                self.retries,
            )
            _retry(run.id)
        elif state in FINAL:
            self._ended(segment, run)

    @staticmethod
    def _ended(segment: Segment, run: Any) -> None:
        segment.state = _state_type(run)
        if segment.state != "COMPLETED":
            segment.error = f"flow run {run.id} ended {segment.state}: {run.state.message or 'no message'}"


def _retry(flow_run_id: Any) -> None:
    """Retry a trial's crashed or failed flow run in place (it resumes its run key exactly)."""
    accepted, reason = retry_in_place(flow_run_id, "retried by its study")
    if not accepted:
        get_run_logger().warning("Prefect refused to retry flow run %s (%s)", flow_run_id, reason)


def _state_type(run: Any) -> str | None:
    return run.state.type.value if run.state is not None else None
