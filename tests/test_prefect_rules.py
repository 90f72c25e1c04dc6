"""The Prefect server rules the run reporting and the sweep rely on, asserted on the shared loopback server with
plain flow runs (no flow executes): the tests that fail first when a Prefect release changes them (docs/architecture.md:
"Prefect internals we touch"; pyproject.toml admits only the Prefect versions these pass on).

- A position message (a Running state proposed with the run marked ``resuming``) shows the message, keeps
  ``run_count`` and leaves no mark; the same proposal unmarked would count a new attempt.
- A Cancelling run refuses it (and the mark is taken back); a final state clears a mark left behind.
- It keeps the run's deployment concurrency slot.
- The sweep's retry is the UI's (an orchestrated AwaitingRetry): accepted for a deployment's crashed run, refused
  for a run without a deployment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from prefect_gliner2.flows.prefect_compat import propose_running_message, set_running_message
from prefect_gliner2.flows.sweep import retry_point

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture
def client() -> Iterator[Any]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client


@pytest.fixture
def deployment(client: Any) -> Iterator[UUID]:
    """A deployment of a flow that never runs (nothing serves it), one slot of deployment concurrency."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    flow_id = client.create_flow_from_name("gliner2-prefect-rules")
    deployment_id = client.create_deployment(flow_id, f"probe-{time.monotonic_ns()}", concurrency_limit=1)
    yield deployment_id
    for run in client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))):
        client.delete_flow_run(run.id)
    client.delete_deployment(deployment_id)


def _running(client: Any, deployment_id: UUID) -> Any:
    """A flow run of `deployment_id` taken Scheduled -> Pending (its concurrency slot) -> Running, as a worker and
    the flow engine do; its first attempt (run_count 1)."""
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Pending, Running, Scheduled

    run = client.create_flow_run_from_deployment(deployment_id, state=Scheduled())
    for state in (Pending(), Running()):
        assert client.set_flow_run_state(run.id, state).status == SetStateStatus.ACCEPT, state
    run = client.read_flow_run(run.id)
    assert run.run_count == 1 and run.state.is_running() and not run.empirical_policy.resuming
    return run


def test_a_position_message_shows_without_counting_an_attempt(client: Any, deployment: UUID) -> None:
    from prefect.states import Running

    run = _running(client, deployment)
    assert set_running_message(client, run.id, "rules: batch 3/12")
    assert not set_running_message(client, run.id, "rules: batch 3/12"), "the same message twice: no new state"
    assert set_running_message(client, run.id, "rules: batch 5/12")
    now = client.read_flow_run(run.id)
    assert (now.state.type.value, now.state.message) == ("RUNNING", "rules: batch 5/12")
    assert now.run_count == 1, "a position message must not count as a new attempt (it would use up retries)"
    assert not now.empirical_policy.resuming, "the server clears the mark in the same transition"
    messages = [s.message for s in client.read_flow_run_states(run.id) if s.type.value == "RUNNING"]
    assert messages[1:] == ["rules: batch 3/12", "rules: batch 5/12"], messages

    # why the mark: the same Running proposal unmarked counts a new attempt
    client.set_flow_run_state(run.id, Running(message="unmarked"))
    assert client.read_flow_run(run.id).run_count == 2, "Running -> Running no longer counts: drop the mark"


def test_a_cancelling_run_refuses_a_position_message_and_the_mark_is_taken_back(client: Any, deployment: UUID) -> None:
    from prefect.states import Cancelling

    run = _running(client, deployment)
    client.set_flow_run_state(run.id, Cancelling())
    assert not set_running_message(client, run.id, "rules: batch 3/12"), "only a Running run gets a message"
    # the race: the run was read Running, the cancellation landed before the proposal
    assert not propose_running_message(client, run.id, run.empirical_policy, "rules: batch 3/12")
    now = client.read_flow_run(run.id)
    assert now.state.type.value == "CANCELLING" and not now.empirical_policy.resuming
    assert now.run_count == 1


def test_a_final_state_clears_a_mark_left_behind(client: Any, deployment: UUID) -> None:
    """A flow process killed between marking its run and proposing the message leaves the mark; the Crashed state
    that the lost-host automation (or the runner) sets then clears it, so the retried attempt counts."""
    from prefect.states import Crashed, Pending, Running

    run = _running(client, deployment)
    client.update_flow_run(run.id, empirical_policy=run.empirical_policy.model_copy(update={"resuming": True}))
    client.set_flow_run_state(run.id, Crashed(message="no heartbeat"), force=True)
    assert not client.read_flow_run(run.id).empirical_policy.resuming
    assert retry_point(run.id)
    for state in (Pending(), Running()):
        client.set_flow_run_state(run.id, state)
    assert client.read_flow_run(run.id).run_count == 2, "the retried attempt is counted"


def test_a_position_message_keeps_the_deployment_concurrency_slot(client: Any, deployment: UUID) -> None:
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Completed, Pending, Scheduled

    run = _running(client, deployment)
    lease = run.state.state_details.deployment_concurrency_lease_id
    assert lease is not None, "a deployment with a concurrency limit leases its slot"
    assert set_running_message(client, run.id, "rules: batch 3/12")
    assert client.read_flow_run(run.id).state.state_details.deployment_concurrency_lease_id == lease
    other = client.create_flow_run_from_deployment(deployment, state=Scheduled())
    waiting = client.set_flow_run_state(other.id, Pending())
    assert waiting.status == SetStateStatus.REJECT, "the slot is still held by the run with the message"
    client.set_flow_run_state(run.id, Completed())
    assert client.set_flow_run_state(other.id, Pending()).status == SetStateStatus.ACCEPT


def test_the_sweep_retries_like_the_ui_and_a_run_without_deployment_is_refused(client: Any, deployment: UUID) -> None:
    from prefect import flow
    from prefect.states import Crashed, Failed

    run = _running(client, deployment)
    client.set_flow_run_state(run.id, Failed(message="boom"))
    assert retry_point(run.id)
    state = client.read_flow_run(run.id).state
    assert (state.type.value, state.name) == ("SCHEDULED", "AwaitingRetry")

    @flow(name="gliner2-prefect-rules-local")
    def local() -> None:
        """Never runs: a flow run without a deployment, which no worker could pick up again."""

    orphan = client.create_flow_run(local, state=Crashed(message="gone"))
    try:
        assert not retry_point(orphan.id)
        assert client.read_flow_run(orphan.id).state.type.value == "CRASHED"
    finally:
        client.delete_flow_run(orphan.id)
