"""A SIGTERM that arrives while Prefect creates a task run still ends the flow run CRASHED, and the run resumes exactly.

Prefect 3.9's task engine handles a ``TerminationSignal`` raised while it creates a task run as a crash of a task run it
has not created yet, and its crash handler raises ``ValueError("Task run is not set")`` in its place: without
``flows.prefect_compat.interrupts_surface`` the flow run ends FAILED and the console script exits with 1 instead of 143
(a CI run of ``test_interrupts.py`` hit exactly that window). Here the window is hit on purpose: the test wraps
Prefect's ``prefect.task_engine._create_task_run_locally`` (a test-only patch of an internal) so that it sends this
process a real SIGTERM as it creates the second checkpoint task run; Prefect's own flow-run SIGTERM handler then raises
inside the task engine's creation step (and once the flow run is recorded, sends it again to the handler it replaced:
here one that only records it, so that it does not end the pytest process)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from prefect_gliner2.flows.cli.interrupts import exit_status
from prefect_gliner2.flows.prefect_compat import interrupt_behind

from support.config import training_config
from support.flow import assert_same_export, make_inputs, reference_export, tiny_model_dir, with_threads

pytestmark = pytest.mark.usefixtures("prefect_server")


def _flow_run_state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    return run.state_type.value if run.state_type else ""


def test_sigterm_while_a_task_run_is_created_crashes_the_flow_run_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.task_engine
    from prefect.exceptions import TerminationSignal

    from prefect_gliner2.flows.prefect_compat import flow_run_id
    from prefect_gliner2.flows.train import train_flow

    space = {"inputs": make_inputs(tmp_path / "data"), "span": tiny_model_dir(tmp_path, "span")}
    original = prefect.task_engine._create_task_run_locally
    seen: dict[str, Any] = {}

    def creating(*args: Any, **kwargs: Any) -> Any:
        task = kwargs.get("task")
        if task is not None and task.name == "checkpoint":
            seen["checkpoints"] = seen.get("checkpoints", 0) + 1
        if seen.get("checkpoints") == 2 and "flow_run_id" not in seen:  # an earlier checkpoint is committed by now
            seen["flow_run_id"] = flow_run_id()
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler), f"no SIGTERM handler of the flow run's engine here ({handler!r})"
            os.kill(os.getpid(), signal.SIGTERM)  # Prefect's handler raises TerminationSignal before the next line
        return original(*args, **kwargs)

    monkeypatch.setattr(prefect.task_engine, "_create_task_run_locally", creating)
    params = with_threads(
        dict(
            model=space["span"],
            train_data=space["inputs"]["train"],
            valid_data=space["inputs"]["valid"],
            config=training_config(),
            run_key="sigterm-in-task-creation",
            storage=str(tmp_path / "runs"),
            checkpointing={"checkpoint_every": 2},
            execution={"batches_per_task": 1, "pipeline_depth": 0},
        )
    )
    redelivered: list[int] = []  # Prefect sends the signal again to the handler it replaced, once it has handled it
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: redelivered.append(signum))
    try:
        with pytest.raises(TerminationSignal) as raised:
            train_flow(**params)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert redelivered == [signal.SIGTERM]
    assert seen, "no checkpoint task run was created"
    assert isinstance(interrupt_behind(raised.value), TerminationSignal)
    assert exit_status(raised.value) == 128 + signal.SIGTERM
    assert _flow_run_state(seen["flow_run_id"]) == "CRASHED"

    monkeypatch.setattr(prefect.task_engine, "_create_task_run_locally", original)
    summary = train_flow(**params)
    assert summary["resumed_from_batch"] > 0, summary  # from a committed checkpoint, not from scratch
    reference = reference_export(space["span"], space["inputs"], training_config(), tmp_path / "reference")
    assert_same_export(summary["export"], reference)


def test_the_exit_status_of_an_error_raised_while_handling_an_interrupt() -> None:
    from prefect.exceptions import TerminationSignal

    def raised_while_handling(interrupt: BaseException) -> BaseException:
        try:
            try:
                raise interrupt
            except BaseException:
                raise ValueError("Task run is not set")  # noqa: B904 (implicitly chained, as in Prefect)
        except ValueError as exc:
            return exc

    assert exit_status(raised_while_handling(TerminationSignal(signal.SIGTERM))) == 128 + signal.SIGTERM
    assert exit_status(raised_while_handling(KeyboardInterrupt())) == 128 + signal.SIGINT
    assert exit_status(ValueError("Task run is not set")) is None
    chained = RuntimeError("outer")
    chained.__cause__ = ValueError("inner")
    assert exit_status(chained) is None and interrupt_behind(chained) is None
