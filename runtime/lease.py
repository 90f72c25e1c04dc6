"""One live run per run key: a lease that a kill -9 cannot leave stuck and that Prefect's recovery can take over.

Local storage: ``fcntl.flock`` on ``<run_dir>/.lease``. The kernel drops the lock when the holding process dies,
however it dies; the file records who holds it, for the error message.

Other fsspec storage (object stores offer neither atomic rename nor compare-and-swap through fsspec): every
contender writes its own claim object ``.lease.d/<owner>.json`` (owner, host, pid and its start time, flow run,
heartbeat, TTL) and then lists ``.lease.d/``. It holds the lease only when that listing shows no other live claim;
two pending contenders settle it by owner id (the larger withdraws). With strongly consistent writes and listings
(S3, GCS, Azure Blob) two contenders can never both hold it: had both proceeded, the later writer's listing would
have shown the earlier claim. The holder renews its claim every TTL/3 and ``check()`` re-lists the claims before
each commit (checkpoint, cursor, export), stopping the run if someone else holds the key now.

Another contender's claim is *stale*, and is deleted by the contender, when
  - it names the contender's own flow run: a retry of that flow run (``prefect flow-run retry``, a retry policy)
    starts only once the previous attempt is over;
  - its process is provably gone: same host, and that pid is not running (or runs with another start time);
  - ``holder_gone(claim)`` says so (the flow asks the Prefect API: the holder's flow run is final or CRASHED);
  - its heartbeat is older than its TTL.
Otherwise the contender waits up to ``wait`` seconds, logging when the claim expires unless renewed, and then
raises RunLockedError saying who holds the key and until when. A claim that cannot be read or listed raises
LeaseUnreadableError: an unreadable lease is never taken as free. No Prefect transaction is involved.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from prefect_gliner2.runtime.errors import LeaseUnreadableError, RunLockedError
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.layout import LEASE_CLAIMS_DIR as CLAIMS_DIR
from prefect_gliner2.session_core.layout import LEASE_FILE
from prefect_gliner2.session_core.tempcopies import process_alive, process_start

__all__ = ["DEFAULT_LEASE_TTL", "DEFAULT_LEASE_WAIT", "RunLease"]

DEFAULT_LEASE_TTL = 60.0
DEFAULT_LEASE_WAIT = 90.0  # longer than the TTL: a lost holder's lease always expires within the wait
_POLL = 0.5

logger = logging.getLogger(__name__)

HolderGone = Callable[[dict[str, Any]], "str | None"]


class RunLease:
    """Exclusive hold on a run key for one live flow run (see the module docstring)."""

    def __init__(
        self,
        run_dir: RunDirectory,
        *,
        flow_run_id: str | None = None,
        ttl: float = DEFAULT_LEASE_TTL,
        wait: float = DEFAULT_LEASE_WAIT,
        holder_gone: HolderGone | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.ttl = ttl
        self.wait = wait
        self.holder_gone = holder_gone
        self.owner: dict[str, Any] = {
            "owner": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
            "flow_run_id": flow_run_id,
        }
        self._fd: int | None = None
        self._stop = threading.Event()
        self._lost: str | None = None
        self.held = False
        self.took_over: list[str] = []  # why stale claims were taken over (for the run's log)

    def __enter__(self) -> RunLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        if self.held:
            return
        if self.run_dir.local:
            self._acquire_flock()
        else:
            self._acquire_claim()
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        else:
            self._stop.set()
            try:
                self.run_dir.fs.rm(self._claim_path(self.owner["owner"]))
            except OSError:
                pass  # expires after its TTL; a same-host successor sees its pid gone at once

    def last_holder(self) -> dict[str, Any] | None:
        """The lease record of the run key's latest holder (a crashed one's stays behind), if any."""
        if not self.run_dir.local:
            try:
                held = [claim for claim in self._claims() if claim.get("held")]
            except LeaseUnreadableError:
                return None  # informational only: acquire() reports an unreadable lease
            return max(held, key=lambda claim: float(claim.get("heartbeat") or 0)) if held else None
        try:
            with open(f"{self.run_dir.path}/{LEASE_FILE}", encoding="utf-8") as handle:
                record = json.loads(handle.read() or "null")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def check(self) -> None:
        """Raise RunLockedError if the lease was lost (someone else holds the run key now); call before commits."""
        if self._lost:
            raise RunLockedError(self._lost)
        if self.held and self._fd is None:
            others = [c for c in self._claims() if c.get("owner") != self.owner["owner"] and c.get("held")]
            if others:
                self._lost = (
                    f"the lease on run key {self.run_dir.run_key!r} was taken over by {_describe(others[0])}; "
                    "this run stops without committing more"
                )
                raise RunLockedError(self._lost)

    # ---- local: flock --------------------------------------------------------------------------------------

    def _acquire_flock(self) -> None:
        import fcntl

        fd = os.open(f"{self.run_dir.path}/{LEASE_FILE}", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _describe_raw(os.pread(fd, 4096, 0))
                    os.close(fd)
                    raise RunLockedError(self._busy_message(holder, None)) from None
                time.sleep(_POLL)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self.owner, "since": time.time()}).encode(), 0)
        self._fd = fd

    # ---- remote: claims ------------------------------------------------------------------------------------

    def _claim_path(self, owner: str) -> str:
        return f"{self.run_dir.path}/{CLAIMS_DIR}/{owner}.json"

    def _write_claim(self, held: bool) -> None:
        record = {**self.owner, "heartbeat": time.time(), "ttl": self.ttl, "held": held}
        self.run_dir.fs.pipe_file(self._claim_path(self.owner["owner"]), json.dumps(record).encode())

    def _claims(self) -> list[dict[str, Any]]:
        """Every claim in .lease.d/ (a fresh listing); LeaseUnreadableError when any cannot be read."""
        fs, folder = self.run_dir.fs, f"{self.run_dir.path}/{CLAIMS_DIR}"
        try:
            fs.invalidate_cache(folder)
            entries = fs.ls(folder, detail=False) if fs.exists(folder) else []
            claims = []
            for entry in entries:
                try:
                    claims.append(json.loads(fs.cat_file(entry)))
                except FileNotFoundError:
                    continue  # withdrawn between the listing and the read
            return claims
        except (OSError, ValueError) as exc:
            raise LeaseUnreadableError(
                f"cannot read the lease of run key {self.run_dir.run_key!r} at {folder} ({type(exc).__name__}: "
                f"{exc}); an unreadable lease is never taken as free: check access to the storage and rerun"
            ) from exc

    def _acquire_claim(self) -> None:
        deadline = time.monotonic() + self.wait
        announced: float | None = None
        while True:
            self._write_claim(held=False)
            blocker = self._blocking_claim()
            if blocker is None:
                self._write_claim(held=True)
                break
            smaller = str(blocker.get("owner", "")) > self.owner["owner"]
            if not blocker.get("held") and smaller and time.monotonic() < deadline + self.ttl:
                time.sleep(0.2)  # two pending contenders: the larger id withdraws, we keep our claim and look again
                continue
            self.run_dir.fs.rm(self._claim_path(self.owner["owner"]))
            expires = float(blocker.get("heartbeat", 0)) + float(blocker.get("ttl", self.ttl))
            if time.monotonic() >= deadline:
                raise RunLockedError(self._busy_message(_describe(blocker), expires))
            if blocker.get("held") and announced != expires:
                announced = expires
                logger.warning(
                    "run key %r is held by %s; its lease expires at %s unless renewed: waiting up to %.0f s more",
                    self.run_dir.run_key,
                    _describe(blocker),
                    _clock(expires),
                    max(0.0, deadline - time.monotonic()),
                )
            time.sleep(_POLL if blocker.get("held") else 0.05 + (int(self.owner["owner"][:4], 16) % 20) / 100)
        self._stop.clear()
        threading.Thread(target=self._heartbeat, name="gliner2-lease-heartbeat", daemon=True).start()

    def _blocking_claim(self) -> dict[str, Any] | None:
        """The live claim (held first) that keeps us from holding the lease; stale claims are deleted."""
        live = []
        for claim in self._claims():
            if claim.get("owner") == self.owner["owner"]:
                continue
            reason = self._stale(claim)
            if reason is None:
                live.append(claim)
                continue
            self.took_over.append(f"{_describe(claim)}: {reason}")
            logger.warning("taking over the lease of run key %r from %s", self.run_dir.run_key, self.took_over[-1])
            try:
                self.run_dir.fs.rm(self._claim_path(str(claim.get("owner"))))
            except FileNotFoundError:
                pass
        live.sort(key=lambda c: (not c.get("held"), str(c.get("owner"))))
        return live[0] if live else None

    def _stale(self, claim: dict[str, Any]) -> str | None:
        """Why `claim` no longer holds the run key, or None while it may still."""
        mine = self.owner["flow_run_id"]
        if mine is not None and claim.get("flow_run_id") == mine:
            return "an earlier attempt of this same flow run"
        if claim.get("host") == self.owner["host"] and not process_alive(claim.get("pid"), claim.get("pid_start")):
            return f"process {claim.get('pid')} on this host is gone"
        if self.holder_gone is not None and claim.get("held"):
            reason = self.holder_gone(claim)
            if reason:
                return reason
        age = time.time() - float(claim.get("heartbeat", 0))
        if age >= float(claim.get("ttl", self.ttl)):
            return f"its heartbeat is {age:.0f} s old, past its {claim.get('ttl')} s TTL"
        return None

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.check()
                self._write_claim(held=True)
            except RunLockedError:
                return
            except Exception:  # noqa: BLE001 - a missed renewal; the next one may succeed within the TTL
                logger.warning("renewing the lease of run key %r failed; retrying", self.run_dir.run_key)

    def _busy_message(self, holder: str, expires: float | None) -> str:
        until = f"; its lease expires at {_clock(expires)} unless renewed" if expires is not None else ""
        return (
            f"run key {self.run_dir.run_key!r} is in use by another live run ({holder}){until}; waited "
            f"{self.wait:.0f} s (lease_wait). Two runs on one run key would interleave: wait for it to finish, "
            "cancel it, or choose a different run key"
        )


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _describe(record: dict[str, Any]) -> str:
    parts = [f"pid {record.get('pid')} on {record.get('host')}"]
    if record.get("flow_run_id"):
        parts.append(f"flow run {record['flow_run_id']}")
    return ", ".join(parts)


def _describe_raw(raw: bytes) -> str:
    try:
        record = json.loads(raw.decode() or "{}")
    except ValueError:
        return "unknown holder"
    return _describe(record) if isinstance(record, dict) else "unknown holder"
