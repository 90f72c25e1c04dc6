"""Test fault injection as an explicit object: a ``FaultPlan`` says what happens at which named point, nothing else.

Production code never builds a plan, and nothing reads one from the environment: a plan exists only when test or
benchmark code constructs it. Worker-side points get it through ``WorkerSpec.faults``; flow-side points use the
plan that test code installed in the flow process with ``install(plan)`` before calling the flow (the flow also
passes that plan on to its worker's spec).

Points: ``batch`` (before the worker trains batch i), ``validate`` (before the validation after batch i),
``checkpoint`` (before the worker writes the checkpoint at batch i), ``checkpoint-write`` (its files complete,
not yet committed), ``export-write`` (export files complete, not yet renamed into place; i is the last batch;
on object storage both fire after each uploaded object, before the marker),
``cursor`` (in the flow process: checkpoint committed, cursor.json not yet moved), ``prune`` (in the flow process:
a pruned checkpoint's index deleted, its files not yet; i is its last batch), ``unit`` (in the flow
process, after the unit ending at batch i finished), ``chunk`` (in the process running an extraction job: before
it computes chunk i).

    plan = FaultPlan(markers="/tmp/m", faults=(Fault.pause("batch", 9, 120), Fault.kill("batch", 4, once="/tmp/d")))
    plan.hit("batch", 9)   # writes /tmp/m/batch-9 (holding the pid), then sleeps 120 s

A ``Fault`` with ``index=None`` fires at any index. Kills, raises and OS errors fire once (pauses may): the first
process to create the fault's ``once`` file fires, later ones (a restarted worker, a resumed flow) pass.
"""

from __future__ import annotations

import errno as errno_codes
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from prefect_gliner2.session_core.errors import ConfigError

__all__ = ["ACTIONS", "POINTS", "Fault", "FaultPlan", "hit", "install", "installed", "uninstall"]

POINTS = frozenset(
    {"batch", "validate", "checkpoint", "checkpoint-write", "export-write", "cursor", "prune", "unit", "chunk"}
)
ACTIONS = frozenset({"pause", "kill", "raise", "oserror"})


@dataclass(frozen=True)
class Fault:
    """One injected fault: `action` at (`point`, `index`)."""

    point: str
    index: int | None
    action: str
    seconds: float = 0.0  # pause: how long
    errno: int = 0  # oserror: which errno
    once: str | None = (
        None  # marker file that makes the fault fire once across processes (kill/raise/oserror: required)
    )

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ConfigError(f"unknown fault point {self.point!r}; use one of {sorted(POINTS)}")
        if self.action not in ACTIONS:
            raise ConfigError(f"unknown fault action {self.action!r}; use one of {sorted(ACTIONS)}")
        if self.action != "pause" and not self.once:
            raise ConfigError(f"a {self.action} fault needs a `once` marker file, or it would fire on every retry")
        if self.action == "oserror" and self.errno not in errno_codes.errorcode:
            raise ConfigError(f"oserror fault with unknown errno {self.errno}; pass e.g. errno.ENOSPC")

    @classmethod
    def pause(cls, point: str, index: int | None, seconds: float, *, once: str | None = None) -> Fault:
        """Sleep there (every time, or only the first time with `once`)."""
        return cls(point, index, "pause", seconds=seconds, once=once)

    @classmethod
    def kill(cls, point: str, index: int | None, *, once: str) -> Fault:
        """SIGKILL the process that reaches the point."""
        return cls(point, index, "kill", once=once)

    @classmethod
    def fail(cls, point: str, index: int | None, *, once: str) -> Fault:
        """Raise a RuntimeError there (a transient failure)."""
        return cls(point, index, "raise", once=once)

    @classmethod
    def os_error(cls, point: str, index: int | None, code: int, *, once: str) -> Fault:
        """Raise OSError(code) there (e.g. errno.ENOSPC: a full storage)."""
        return cls(point, index, "oserror", errno=code, once=once)

    def matches(self, point: str, index: int) -> bool:
        return self.point == point and (self.index is None or self.index == index)


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one test run, and where reached points are recorded (`markers`: DIR/<point>-<i>)."""

    faults: tuple[Fault, ...] = ()
    markers: str | None = None

    def hit(self, point: str, index: int) -> None:
        """Record the point, then run every fault planned there."""
        if self.markers:
            _write_marker(os.path.join(self.markers, f"{point}-{index}"))
        for fault in self.faults:
            if fault.matches(point, index):
                _fire(fault, point, index)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        data: dict[str, Any] = json.loads(text)
        return cls(tuple(Fault(**item) for item in data.get("faults", ())), data.get("markers"))


_INSTALLED: FaultPlan | None = None


def install(plan: FaultPlan | None) -> None:
    """Use `plan` at this process's flow-side points (and pass it to workers started from now on)."""
    global _INSTALLED
    _INSTALLED = plan


def uninstall() -> None:
    install(None)


def installed() -> FaultPlan | None:
    """The plan test code installed in this process; None in production."""
    return _INSTALLED


def hit(point: str, index: int) -> None:
    """A flow-side point: runs the installed plan there; returns at once when none is installed."""
    plan = _INSTALLED
    if plan is not None:
        plan.hit(point, index)


def _fire(fault: Fault, point: str, index: int) -> None:
    if fault.once is not None and not _first_time(fault.once):
        return
    if fault.action == "pause":
        time.sleep(fault.seconds)
        return
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    if fault.action == "raise":
        raise RuntimeError(f"injected transient failure at {point} {index} (fault plan)")
    raise OSError(fault.errno, f"{os.strerror(fault.errno)} (injected at {point} {index}, fault plan)")


def _write_marker(path: str) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def _first_time(marker_file: str) -> bool:
    try:
        fd = os.open(marker_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True
