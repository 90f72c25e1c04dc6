"""One live run per run key: a lease that a kill -9 cannot leave stuck.

Local storage: ``fcntl.flock`` on ``<run_dir>/.lease``. The kernel drops the lock when the holding process dies,
however it dies, so a crashed run never blocks its successor; the file also records who holds it, for the error
message. Other fsspec storage: ``.lease`` is a JSON record (owner, host, pid, flow run, heartbeat time, TTL)
renewed by a heartbeat thread; a record whose heartbeat is older than its TTL is taken over. Object stores offer no
compare-and-swap through fsspec, so the remote lease re-reads its record after writing to detect a racing taker
and stops the run if the record ever names someone else (``RunLease.check``).

No Prefect transaction or SERIALIZABLE isolation is involved (those hang after a kill -9).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from prefect_gliner2.runtime.errors import RunLockedError
from prefect_gliner2.runtime.rundir import RunDirectory
from prefect_gliner2.session_core.layout import LEASE_FILE

__all__ = ["RunLease"]


class RunLease:
    """Exclusive hold on a run key for one live flow run (see the module docstring)."""

    def __init__(self, run_dir: RunDirectory, *, flow_run_id: str | None = None, ttl: float = 60.0) -> None:
        self.run_dir = run_dir
        self.ttl = ttl
        self.owner = {
            "owner": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "flow_run_id": flow_run_id,
        }
        self._fd: int | None = None
        self._stop = threading.Event()
        self._lost: str | None = None
        self.held = False

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
            self._acquire_record()
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
            record = self._read_record()
            if record is not None and record.get("owner") == self.owner["owner"]:
                self.run_dir.fs.rm(self._path())

    def last_holder(self) -> dict[str, Any] | None:
        """The lease record of the run key's latest holder (a crashed one's stays behind), if any."""
        if not self.run_dir.local:
            return self._read_record()
        try:
            with open(self._path(), encoding="utf-8") as handle:
                record = json.loads(handle.read() or "null")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def check(self) -> None:
        """Raise if the lease was lost (remote storage: someone else took it); call before committing anything."""
        if self._lost:
            raise RunLockedError(self._lost)

    # ---- local: flock --------------------------------------------------------------------------------------

    def _path(self) -> str:
        return f"{self.run_dir.path}/{LEASE_FILE}"

    def _acquire_flock(self) -> None:
        import fcntl

        fd = os.open(self._path(), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            raise RunLockedError(self._busy_message(holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self.owner, "since": time.time()}).encode(), 0)
        self._fd = fd

    # ---- remote: lease record with heartbeat ---------------------------------------------------------------

    def _read_record(self) -> dict[str, Any] | None:
        fs = self.run_dir.fs
        try:
            return json.loads(fs.cat_file(self._path())) if fs.exists(self._path()) else None
        except (ValueError, OSError):
            return None

    def _write_record(self) -> None:
        record = {**self.owner, "heartbeat": time.time(), "ttl": self.ttl}
        self.run_dir.fs.pipe_file(self._path(), json.dumps(record).encode())

    def _acquire_record(self) -> None:
        record = self._read_record()
        if record is not None and record.get("owner") != self.owner["owner"]:
            age = time.time() - float(record.get("heartbeat", 0))
            if age < float(record.get("ttl", self.ttl)):
                raise RunLockedError(self._busy_message(_describe(json.dumps(record).encode())))
        self._write_record()
        time.sleep(min(1.0, self.ttl / 20))
        confirmed = self._read_record()
        if confirmed is None or confirmed.get("owner") != self.owner["owner"]:
            raise RunLockedError(self._busy_message(_describe(json.dumps(confirmed or {}).encode())))
        self._stop.clear()
        threading.Thread(target=self._heartbeat, name="gliner2-lease-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            if not self._heartbeat_once():
                return

    def _heartbeat_once(self) -> bool:
        """Renew the record; False (and the lease marked lost) when someone else holds it now."""
        record = self._read_record()
        if record is not None and record.get("owner") != self.owner["owner"]:
            self._lost = (
                f"the lease on run key {self.run_dir.run_key!r} was taken over by "
                f"{_describe(json.dumps(record).encode())}; this run stops without committing more"
            )
            return False
        try:
            self._write_record()
        except OSError:
            pass  # a missed renewal; the next one may succeed before the TTL runs out
        return True

    def _busy_message(self, holder: str) -> str:
        return (
            f"run key {self.run_dir.run_key!r} is in use by another live run ({holder}); two runs on one run key "
            "would interleave. Wait for it to finish (or cancel it), or choose a different run key"
        )


def _describe(raw: bytes) -> str:
    try:
        record = json.loads(raw.decode() or "{}")
    except ValueError:
        return "unknown holder"
    parts = [f"pid {record.get('pid')} on {record.get('host')}"]
    if record.get("flow_run_id"):
        parts.append(f"flow run {record['flow_run_id']}")
    return ", ".join(parts)
