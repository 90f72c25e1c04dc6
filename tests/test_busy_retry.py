"""Reporting's own short retries while the Prefect server is busy (503 on SQLite): retry_busy, the BusyRetrying
client, and the labels lane that turns the client's long back-off off."""

from __future__ import annotations

import time

import httpx
import pytest
from prefect.exceptions import PrefectHTTPStatusError

from prefect_gliner2.flows import prefect_ui
from prefect_gliner2.flows.prefect_ui import BusyRetrying, Lane, retry_busy


def _status_error(code: int) -> PrefectHTTPStatusError:
    request = httpx.Request("PATCH", "http://server/api/flow_runs/x/labels")
    return PrefectHTTPStatusError(f"{code}", request=request, response=httpx.Response(code, request=request))


class Flaky:
    """Fails with `errors` in turn, then returns 'ok'; records when it was called."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[float] = []

    def __call__(self, *args: object) -> str:
        self.calls.append(time.monotonic())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_busy_answers_are_retried_after_short_pauses() -> None:
    call = Flaky(_status_error(503), _status_error(503), httpx.ConnectError("refused"), _status_error(429))
    assert retry_busy(call, limit=10) == "ok"
    pauses = [b - a for a, b in zip(call.calls, call.calls[1:], strict=False)]
    assert len(pauses) == 4 and all(p < 1.0 for p in pauses)  # not Prefect's 2, 4, 8 s back-off
    assert sum(pauses) >= sum(prefect_ui.BUSY_PAUSES[:4]) * 0.9


def test_other_errors_are_raised_at_once_and_busy_ones_when_time_runs_out() -> None:
    missing = Flaky(_status_error(404))
    with pytest.raises(PrefectHTTPStatusError, match="404"):
        retry_busy(missing, limit=10)
    assert len(missing.calls) == 1
    busy = Flaky(*[_status_error(503)] * 100)
    started = time.monotonic()
    with pytest.raises(PrefectHTTPStatusError, match="503"):
        retry_busy(busy, limit=0.5)
    assert 2 <= len(busy.calls) and time.monotonic() - started < 1.0


def test_a_busy_retrying_client_retries_each_method_call() -> None:
    class Client:
        url = "http://server"

        def __init__(self) -> None:
            self.update_flow_run_labels = Flaky(_status_error(503))

    wrapped = BusyRetrying(Client(), limit=5)
    assert wrapped.url == "http://server"
    assert wrapped.update_flow_run_labels("run", {"a": 1}) == "ok"


@pytest.mark.usefixtures("prefect_server")
def test_a_labels_lane_turns_the_clients_own_retries_off() -> None:
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    seen: dict[str, object] = {}
    default = PREFECT_CLIENT_MAX_RETRIES.value()
    for name, retries in (("plain", None), ("labels", 5.0)):
        lane = Lane(f"test-{name}", "key", own_retries=retries)

        def job(client: object, name: str = name) -> None:
            seen[name] = (PREFECT_CLIENT_MAX_RETRIES.value(), type(client).__name__)

        lane.submit(job)
        assert lane.close(30)
    assert seen == {"plain": (default, "SyncPrefectClient"), "labels": (0, "BusyRetrying")}
    assert default > 0 and PREFECT_CLIENT_MAX_RETRIES.value() == default  # this thread's settings untouched
