"""A closed run reporter proposes no Running state: a run that ends by an interrupt or a failure is recorded Crashed
or Failed by Prefect's engine after the reporter closes, and the server would accept a Running state proposed after
that (a run may leave Crashed for Running), leaving the run showing RUNNING."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from uuid import uuid4

from prefect_gliner2.flows.reporting import RunReporter

from support.session import make_config, make_plan


class _Client:
    """The calls a labels update makes, recorded; the run reads as Running."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def update_flow_run_labels(self, flow_run_id: Any, labels: dict[str, Any]) -> None:
        self.calls.append("labels")

    def read_flow_run(self, flow_run_id: Any) -> Any:
        self.calls.append("read")
        state = SimpleNamespace(type=_running(), message="an older message")
        return SimpleNamespace(state=state, empirical_policy=_Policy())

    def update_flow_run(self, flow_run_id: Any, **fields: Any) -> None:
        self.calls.append("policy")

    def set_flow_run_state(self, flow_run_id: Any, state: Any) -> Any:
        from prefect.client.schemas.responses import SetStateStatus

        self.calls.append(f"state {state.type.value}")
        return SimpleNamespace(status=SetStateStatus.ACCEPT)


class _Policy:
    def model_copy(self, update: dict[str, Any]) -> _Policy:
        return self


def _running() -> Any:
    from prefect.client.schemas.objects import StateType

    return StateType.RUNNING


def _reporter() -> RunReporter:
    # no flow run id: no lanes and no threads; the labels job is called directly with the recording client
    reporter = RunReporter("r", make_plan("span", make_config("span", False)), flow_run_id=None)
    reporter.flow_run_id = str(uuid4())
    return reporter


def test_a_labels_update_shows_the_position_as_the_running_state_message_while_the_run_is_open() -> None:
    client = _Client()
    _reporter()._labels_now(client)
    assert client.calls == ["labels", "read", "policy", "state RUNNING"]


def test_after_close_a_labels_update_still_sets_labels_but_proposes_no_running_state() -> None:
    reporter, client = _reporter(), _Client()
    reporter.close(timeout=1.0)
    reporter._labels_now(client)  # a job still queued (or started) in the labels lane when the run ended
    assert client.calls == ["labels"]
