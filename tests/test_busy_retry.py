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


class _BusyServer:
    """A loopback HTTP server that answers the first `busy` PATCHes with 503 (what Prefect's server answers when
    SQLite is locked), then 204; it records when each PATCH arrived."""

    def __init__(self, busy: int) -> None:
        import http.server
        import threading

        self.busy, self.patches = busy, []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.patches.append((time.monotonic(), self.path))
                code = 503 if len(owner.patches) <= owner.busy else 204
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802 - the client's CSRF token request: 404 (no CSRF, as in 3.9's own
                self.send_response(404)  # test servers)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_lane_with_its_own_retries_never_sleeps_the_clients_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect's client sleeps its 2 s back-off after a busy answer even with its retries at 0: the lane's response
    hook stops it first, so a labels update the server refuses twice lands after two short pauses, not seconds."""
    import threading
    import uuid

    from prefect.settings import PREFECT_API_URL, temporary_settings

    sleeps: list[tuple[str, float]] = []
    real_sleep = time.sleep

    def recording_sleep(seconds: float) -> None:
        sleeps.append((threading.current_thread().name, seconds))
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", recording_sleep)
    server = _BusyServer(busy=2)
    try:
        with temporary_settings({PREFECT_API_URL: server.url}):
            lane = Lane("test-busy-labels", "key", own_retries=10.0)
        run_id = uuid.uuid4()
        errors: list[BaseException] = []

        def job(client: object) -> None:
            try:
                client.update_flow_run_labels(run_id, {"a": 1})  # type: ignore[attr-defined]
            except BaseException as exc:  # the lane would only log it: keep it for the assertion
                errors.append(exc)

        lane.submit(job)
        assert lane.close(30)
    finally:
        server.close()
    assert not errors
    assert [path for _, path in server.patches] == [f"/api/flow_runs/{run_id}/labels"] * 3  # 2 busy, then done
    lane_sleeps = [seconds for name, seconds in sleeps if name == "test-busy-labels"]
    assert lane_sleeps == list(prefect_ui.BUSY_PAUSES[:2])  # our two short pauses, never the client's back-off
