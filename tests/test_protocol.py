"""The worker protocol and fault plans without a worker: dispatch table, error round trips, the before_commit hook."""

from __future__ import annotations

import dataclasses
import errno
import os
import pickle
from pathlib import Path

import pytest

from prefect_gliner2.runtime import faults, protocol
from prefect_gliner2.runtime.errors import RunLockedError, StorageFullError, WorkerError, is_transient
from prefect_gliner2.runtime.faults import Fault, FaultPlan
from prefect_gliner2.runtime.protocol import (
    Advance,
    Checkpoint,
    CommitCheckpoint,
    Export,
    RemoteError,
    Reply,
    Request,
    Score,
    Status,
    Summary,
    Validate,
    decode_error,
    encode_error,
)
from prefect_gliner2.runtime.session_runner import HANDLERS, SessionRunner
from prefect_gliner2.session_core.checkpoint import read_checkpoint, write_checkpoint
from prefect_gliner2.session_core.errors import CheckpointError, ConfigError, SessionCoreError

ROOT = Path(__file__).resolve().parents[1]


def _through_the_pipe(exc: BaseException) -> BaseException:
    """What the client raises for `exc` raised in the worker (pickled like a multiprocessing message)."""
    try:
        raise exc
    except BaseException as raised:  # noqa: BLE001 - encoded like the worker does
        reply = pickle.loads(pickle.dumps(Reply(7, encode_error(raised, 4242))))
    assert isinstance(reply.result, RemoteError)
    return decode_error(reply.result, 4242)


def test_every_request_type_has_exactly_one_handler() -> None:
    requests = {cls for cls in vars(protocol).values() if isinstance(cls, type) and issubclass(cls, Request)}
    assert set(HANDLERS) == requests - {Request}
    ops = {"status", "advance", "validate", "checkpoint", "commit-checkpoint", "export", "summary", "score"}
    assert {cls.op for cls in HANDLERS} == ops
    with pytest.raises(TypeError, match="no operation for str"):
        object.__new__(SessionRunner).execute("advance")


def test_requests_are_values() -> None:
    assert Advance(first=1, through=2) == Advance(1, 2) and hash(Advance(1, 2)) == hash(Advance(first=1, through=2))
    assert Advance(1, 2) != Advance(1, 3) and Status() == Status() and Summary() != Status()
    assert {Checkpoint(3, "a"): 1}[Checkpoint(index=3, uri="a")] == 1
    assert Checkpoint(3, "a") == Checkpoint(3, "a", background=False) != Checkpoint(3, "a", background=True)
    assert CommitCheckpoint(3, "a") != Checkpoint(3, "a") and CommitCheckpoint(3, "a").op == "commit-checkpoint"
    assert Export("u") == Export(uri="u", which="best") and Validate(5).op == "validate"
    score = Score({"candidate": "c"}, "tiny:span", {"valid_data": "v.jsonl"}, {})
    assert {score: 1}[score] == 1 and score != Score({"candidate": "c"}, "tiny:span", {"valid_data": "v.jsonl"}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        Advance(1, 2).first = 0  # type: ignore[misc]


def test_session_core_errors_keep_class_fields_and_remote_traceback() -> None:
    full = _through_the_pipe(StorageFullError(errno.EFBIG, "the disk said no"))
    assert type(full) is StorageFullError and full.errno == errno.EFBIG and str(full) == "the disk said no"
    assert not is_transient(full) and "_through_the_pipe" in full.remote_traceback  # type: ignore[attr-defined]
    assert any("session worker pid 4242" in note for note in full.__notes__)
    damaged = _through_the_pipe(CheckpointError("checkpoint x is damaged"))
    assert type(damaged) is CheckpointError and str(damaged) == "checkpoint x is damaged"
    locked = RunLockedError("held by flow run 1")
    locked.holder = "flow-run-1"  # type: ignore[attr-defined]
    rebuilt = _through_the_pipe(locked)
    assert type(rebuilt) is RunLockedError and rebuilt.holder == "flow-run-1"  # type: ignore[attr-defined]


def test_a_full_storage_oserror_becomes_storage_full_error_with_its_errno() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("while writing the checkpoint") from inner
    except RuntimeError as outer:
        full = _through_the_pipe(outer)
    assert type(full) is StorageFullError and full.errno == errno.ENOSPC
    assert (
        "ENOSPC" in str(full) and "RuntimeError in session worker pid 4242" in str(full) and "free space" in str(full)
    )


def test_other_exceptions_become_worker_error_naming_the_remote_type() -> None:
    plain = _through_the_pipe(KeyError("cursor"))
    assert type(plain) is WorkerError and is_transient(plain) and plain.remote_type == "KeyError"
    assert str(plain).startswith("KeyError in session worker pid 4242: 'cursor'")

    class CustomError(SessionCoreError):  # ours in spirit, but not from a module the client rebuilds from
        pass

    custom = _through_the_pipe(CustomError("odd"))
    assert type(custom) is WorkerError and custom.remote_type.endswith("CustomError")
    assert custom.remote_type.startswith("test_protocol.") and "CustomError" in custom.remote_traceback
    assert pickle.loads(pickle.dumps(custom)).remote_type == custom.remote_type


def test_fault_plan_is_explicit_validated_and_round_trips(tmp_path: Path) -> None:
    once = str(tmp_path / "once")
    plan = FaultPlan((Fault.fail("batch", 1, once=once), Fault.pause("unit", None, 0.0)), markers=str(tmp_path))
    assert FaultPlan.from_json(plan.to_json()) == plan
    plan.hit("batch", 0)  # no fault at batch 0: only the marker
    assert (tmp_path / "batch-0").read_text() == str(os.getpid())
    with pytest.raises(RuntimeError, match="injected transient failure at batch 1"):
        plan.hit("batch", 1)
    plan.hit("batch", 1)  # once: the marker file exists now
    for bad, match in (
        (lambda: Fault("bach", 1, "pause"), "unknown fault point 'bach'"),
        (lambda: Fault("batch", 1, "explode"), "unknown fault action"),
        (lambda: Fault("batch", 1, "kill"), "needs a `once` marker"),
        (lambda: Fault.os_error("batch", 1, 99999, once=once), "unknown errno"),
    ):
        with pytest.raises(ConfigError, match=match):
            bad()


def test_the_environment_cannot_enable_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old environment hooks do nothing, and no shipped module reads such a variable."""
    for name in ("DIE", "RAISE", "OSERROR", "PAUSE", "MARKERS"):
        monkeypatch.setenv(f"PREFECT_GLINER2_TEST_{name}", f"unit:*:{tmp_path / name}")
    assert faults.installed() is None
    faults.hit("unit", 3)  # nothing installed: nothing happens
    assert list(tmp_path.iterdir()) == []
    shipped = [
        p
        for pkg in ("session_core", "runtime", "tasks", "flows", "model_registry", "deployments")
        for p in (ROOT / pkg).rglob("*.py")
    ]
    offenders = [str(p) for p in shipped if "PREFECT_GLINER2_TEST" in p.read_text() or "os.rename =" in p.read_text()]
    assert shipped and not offenders
    source = (ROOT / "runtime" / "faults.py").read_text()
    assert "os.environ" not in source and "getenv" not in source


def test_before_commit_runs_once_the_files_are_written_and_a_failure_commits_nothing(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def look() -> None:
        staging = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
        seen.append(sorted(q.name for q in staging[0].iterdir()))

    digest = write_checkpoint(str(tmp_path / "ok"), {"a.bin": b"abc"}, {"k": 1}, before_commit=look)
    assert seen == [["a.bin", "checkpoint.json"]] and len(digest) == 64
    assert read_checkpoint(str(tmp_path / "ok")).require("a.bin") == b"abc"

    def refuse() -> None:
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(OSError, match="full"):
        write_checkpoint(str(tmp_path / "no"), {"a.bin": b"abc"}, {}, before_commit=refuse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]  # nothing committed, no staging debris


def test_every_error_class_of_ours_survives_the_pipe() -> None:
    import importlib

    from prefect_gliner2.runtime.protocol import REMOTE_ERROR_MODULES

    homes = [importlib.import_module(name) for name in REMOTE_ERROR_MODULES]
    classes = [
        cls
        for home in homes
        for cls in vars(home).values()
        if isinstance(cls, type) and issubclass(cls, SessionCoreError) and cls.__module__ == home.__name__
    ]
    assert len(classes) >= 20 and {c.__name__ for c in classes} >= {"RunLockedError", "StorageFullError"}
    for cls in classes:
        original = cls(errno.EROFS, "read-only") if issubclass(cls, OSError) else cls(f"{cls.__name__} happened")
        rebuilt = _through_the_pipe(original)
        assert type(rebuilt) is cls and str(rebuilt) == str(original) and rebuilt.args == original.args, cls
