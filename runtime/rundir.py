"""The run directory on fsspec storage: layout, run-key rules, owner-only files, write-once manifest, durable cursor.

    <storage>/<run_key>/
        manifest.json                       the plan, content-addressed; written once (holds the training data)
        run.json                            run settings that must not change on resume (model, threads, device)
        cursor.json                         the durable cursor: newest committed checkpoint + its cursor
        checkpoints/step-000012-batch-000047/   managed checkpoints (atomic, hash-verified)
        checkpoints/blobs/                  best weights, content-addressed, kept while a checkpoint refers to them
        export/                             the exported model (unless an export location is given)
        .lease                              the lease (flock on local storage; owner + heartbeat elsewhere)

The names are ``prefect_gliner2.session_core.layout``'s; writes and debris cleaning follow its ``storage`` module.
On local storage directories are created 0o700 and files 0o600. The durable cursor is replaced atomically and
only ever moves forward; checkpoints are found through it, never by listing or modification time.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect_gliner2.runtime.errors import RunConflictError, RunKeyError
from prefect_gliner2.session_core import layout
from prefect_gliner2.session_core.errors import ConfigError
from prefect_gliner2.session_core.storage import is_local, remove_debris, resolve, write_atomic

__all__ = ["CURSOR_VERSION", "DurableCursor", "RunDirectory", "checkpoint_position", "validate_run_key"]

CURSOR_VERSION = 1
RUN_INFO_VERSION = 1
_RUN_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_run_key(run_key: Any) -> str:
    """A run key names one directory: 1-128 of [A-Za-z0-9_.-], starting alphanumeric, no '..'."""
    if not isinstance(run_key, str) or not _RUN_KEY.match(run_key) or ".." in run_key:
        raise RunKeyError(
            f"invalid run key {run_key!r}: use 1-128 letters, digits, '_', '-' or '.', starting with a letter or "
            "digit, without '..' or slashes (e.g. 'ner-2024-06-01')"
        )
    return run_key


def checkpoint_position(name: str) -> tuple[int, int]:
    """(optimizer step, last batch included) of a checkpoint directory name."""
    position = layout.parse_checkpoint_name(name)
    if position is None:
        raise ValueError(f"{name!r} is not a checkpoint directory name (step-NNNNNN-batch-NNNNNN)")
    return position


@dataclass(frozen=True)
class DurableCursor:
    """cursor.json: where a resumed run continues (the newest committed checkpoint), plus the final export."""

    checkpoint: str
    cursor: int
    step: int
    epoch: int
    finished: bool
    fingerprint: str
    committed_at: float = field(default_factory=time.time)
    export: str | None = None
    summary: dict[str, Any] | None = None
    version: int = CURSOR_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> DurableCursor:
        version = data.get("version")
        if not isinstance(version, int) or version > CURSOR_VERSION:
            raise RunConflictError(
                f"{where} has cursor format version {version!r}; this prefect-gliner2 reads "
                f"up to {CURSOR_VERSION}: upgrade prefect-gliner2"
            )
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        try:
            return cls(**known)
        except TypeError as exc:
            raise RunConflictError(f"{where} is not a valid durable cursor ({exc}); restore it from a backup") from exc


class RunDirectory:
    """Paths and small-file operations of one run directory (see the module docstring)."""

    def __init__(self, storage: str, run_key: str) -> None:
        self.run_key = validate_run_key(run_key)
        self.storage = os.path.expanduser(storage) if "://" not in storage else storage
        self.fs, root = resolve(self.storage)
        self.local = is_local(self.fs)
        root = os.path.abspath(root) if self.local else root
        self.path = f"{root}/{self.run_key}"
        self.uri = self.path if self.local else self.fs.unstrip_protocol(self.path)

    def join(self, *parts: str) -> str:
        return "/".join([self.uri, *parts])

    @property
    def manifest_uri(self) -> str:
        return self.join(layout.MANIFEST_FILE)

    @property
    def cursor_uri(self) -> str:
        return self.join(layout.CURSOR_FILE)

    @property
    def default_export_uri(self) -> str:
        return self.join(layout.EXPORT_DIR)

    @property
    def checkpoints_uri(self) -> str:
        return self.join(layout.CHECKPOINTS_DIR)

    def checkpoint_uri(self, name: str) -> str:
        return self.join(layout.CHECKPOINTS_DIR, name)

    # ---- creation and write-once files ---------------------------------------------------------------------

    def create(self) -> None:
        """Create the run directory (owner-only on local storage) and its checkpoints/ folder."""
        try:
            if self.local:
                for path in (self.path, self._checkpoints):
                    os.makedirs(path, mode=0o700, exist_ok=True)
                os.chmod(self.path, 0o700)
            else:
                self.fs.makedirs(self._checkpoints, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create run directory {self.uri}: {exc.strerror or exc}; pass a writable "
                "directory or fsspec URL as storage"
            ) from exc

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(f"{self.path}/{name}"))

    def read_bytes(self, name: str) -> bytes | None:
        path = f"{self.path}/{name}"
        return bytes(self.fs.cat_file(path)) if self.fs.exists(path) else None

    def write_bytes(self, name: str, data: bytes) -> None:
        """Atomically replace `name` (``storage.write_atomic``)."""
        write_atomic(self.fs, f"{self.path}/{name}", data)

    def ensure_manifest(self, manifest: bytes) -> bool:
        """Write the manifest if the run is new (True); refuse a different one under this run key."""
        existing = self.read_bytes(layout.MANIFEST_FILE)
        if existing is None:
            self.write_bytes(layout.MANIFEST_FILE, manifest)
            return True
        if existing != manifest:
            raise RunConflictError(_manifest_difference(self.run_key, self.uri, existing, manifest))
        return False

    def ensure_run_info(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Record run settings on first use; afterwards they must match (returns the recorded ones)."""
        data = self.read_bytes(layout.RUN_INFO_FILE)
        if data is None:
            record = {"version": RUN_INFO_VERSION, **settings}
            self.write_bytes(layout.RUN_INFO_FILE, json.dumps(record, sort_keys=True, indent=1).encode())
            return record
        record = json.loads(data)
        differing = [
            f"{k}: recorded {record.get(k)!r}, requested {v!r}" for k, v in settings.items() if record.get(k) != v
        ]
        if differing:
            raise RunConflictError(
                f"run key {self.run_key!r} was started with different settings ({'; '.join(differing)}); resume "
                "with the recorded settings (they decide the exact numerics) or use a new run key"
            )
        return dict(record)

    def read_run_info(self) -> dict[str, Any] | None:
        data = self.read_bytes(layout.RUN_INFO_FILE)
        return json.loads(data) if data is not None else None

    # ---- durable cursor ------------------------------------------------------------------------------------

    def read_cursor(self) -> DurableCursor | None:
        data = self.read_bytes(layout.CURSOR_FILE)
        if data is None:
            return None
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise RunConflictError(f"{self.cursor_uri} is not valid JSON ({exc}); restore it from a backup") from exc
        return DurableCursor.from_dict(parsed, self.cursor_uri)

    def commit_cursor(self, new: DurableCursor) -> bool:
        """Move the durable cursor to `new` if that is forward (or adds the export, or a pause record to an
        unfinished position: ``runtime.pause``); never moves it back."""
        current = self.read_cursor()
        if current is not None:
            if current.fingerprint != new.fingerprint:
                raise RunConflictError(
                    f"{self.cursor_uri} belongs to plan {current.fingerprint[:12]}, not "
                    f"{new.fingerprint[:12]}; the run directory was modified: use a new run key"
                )
            forward = new.cursor > current.cursor or (
                new.cursor == current.cursor
                and (
                    (new.finished and not current.finished)
                    or (new.export is not None and current.export is None)
                    or (not new.finished and not current.finished and new.summary is not None)
                )
            )
            if not forward:
                return False
        self._write_cursor(new)
        return True

    def _write_cursor(self, cursor: DurableCursor) -> None:
        self.write_bytes(layout.CURSOR_FILE, json.dumps(cursor.to_dict(), sort_keys=True, indent=1).encode())

    def newest_checkpoint_uri(self) -> str | None:
        """The checkpoint the durable cursor names (what a fresh worker restores), or None for a new run."""
        cursor = self.read_cursor()
        return self.checkpoint_uri(cursor.checkpoint) if cursor is not None else None

    # ---- damaged checkpoints --------------------------------------------------------------------------------

    def committed_checkpoints(self) -> list[str]:
        """Names of checkpoints with a committed index, ordered by their step and batch numbers (never by mtime)."""
        return self._checkpoint_dirs(committed=True)

    def uncommitted_checkpoints(self) -> list[str]:
        """Checkpoint-named directories without an index: a write or a prune that was interrupted."""
        return self._checkpoint_dirs(committed=False)

    def _checkpoint_dirs(self, *, committed: bool) -> list[str]:
        folder = self._checkpoints
        if not self.fs.exists(folder):
            return []
        self.fs.invalidate_cache(folder)  # other processes write here (object-store listings are cached)
        found = []
        for entry in self.fs.ls(folder, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            position = layout.parse_checkpoint_name(name)
            if position and self.fs.exists(f"{folder}/{name}/{layout.CHECKPOINT_INDEX_FILE}") == committed:
                found.append((*position, name))
        return [name for *_, name in sorted(found)]

    def recover_damaged_restore_point(self, epoch_of: Any) -> str | None:
        """If the checkpoint the cursor names fails the index check (the index parses, every file it lists is present
        with its recorded size: stats only, no payload is read), quarantine it and rewind the cursor to the newest
        earlier checkpoint of the same plan that passes the same check. Contents are verified by the worker as it
        restores; when that fails, call `fall_back_from`. Returns the quarantined name, None when the index check
        passes; raises CheckpointError when no intact earlier checkpoint exists. Call only while holding the lease."""
        from prefect_gliner2.session_core.checkpoint import open_checkpoint
        from prefect_gliner2.session_core.errors import CheckpointError

        cursor = self.read_cursor()
        if cursor is None:
            return None
        try:
            open_checkpoint(self.checkpoint_uri(cursor.checkpoint), min_version=1)
            return None
        except CheckpointError as exc:
            return self._rewind(cursor, exc, epoch_of)

    def fall_back_from(self, checkpoint_uri: str, damage: Exception, epoch_of: Any) -> str:
        """The worker found `checkpoint_uri` (the cursor's checkpoint) damaged while restoring it: quarantine it and
        rewind the cursor as `recover_damaged_restore_point` does. Returns the quarantined name; raises `damage`
        (with the reason) when the cursor names another checkpoint, CheckpointError when no earlier one is intact."""
        cursor = self.read_cursor()
        if cursor is None or self.checkpoint_uri(cursor.checkpoint) != checkpoint_uri:
            raise damage
        return self._rewind(cursor, damage, epoch_of)

    def _rewind(self, cursor: DurableCursor, damage: Exception, epoch_of: Any) -> str:
        from prefect_gliner2.session_core.checkpoint import open_checkpoint
        from prefect_gliner2.session_core.errors import CheckpointError

        for name in reversed(self.committed_checkpoints()):
            if name == cursor.checkpoint:
                continue
            try:
                meta = open_checkpoint(self.checkpoint_uri(name), min_version=1).meta
            except CheckpointError:
                continue
            if meta.get("plan_fingerprint") != cursor.fingerprint or int(meta.get("cursor", -1)) > cursor.cursor:
                continue
            self._quarantine(cursor.checkpoint)
            position = int(meta["cursor"])
            rewound = DurableCursor(
                checkpoint=name,
                cursor=position,
                step=int(meta["step"]),
                epoch=int(epoch_of(position - 1)) if position else 0,
                finished=bool(meta.get("finished")),
                fingerprint=cursor.fingerprint,
            )
            self._write_cursor(rewound)
            return cursor.checkpoint
        raise CheckpointError(
            f"{damage}; no intact earlier checkpoint of this run exists: start again under a new run key"
        ) from damage

    def _quarantine(self, name: str) -> None:
        """Move a damaged checkpoint aside (kept for inspection; debris cleaning leaves it alone)."""
        source = f"{self._checkpoints}/{name}"
        target = f"{self._checkpoints}/{layout.damaged_name(name, int(time.time()))}"
        self.fs.mv(source, target, recursive=True)

    # ---- debris --------------------------------------------------------------------------------------------

    def remove_debris(self, export_uri: str | None = None) -> list[str]:
        """Delete half-written checkpoints, exports and temp files left by a killed run, and the directories of a
        half-done prune (only while holding the lease). Besides the run directory, the staging folders of a local
        `export_uri` (next to it) are removed."""
        removed: list[str] = []
        for folder in (self.path, self._checkpoints):
            removed += remove_debris(self.fs, folder)
        removed += self.remove_half_pruned()
        if export_uri is not None:
            export_fs, export_path = resolve(export_uri)
            if is_local(export_fs):
                parent, name = os.path.split(export_path)
                removed += remove_debris(export_fs, parent, of=name)
        return removed

    def remove_half_pruned(self) -> list[str]:
        """Delete index-less checkpoint directories that lie before the checkpoint the cursor names: a prune killed
        between deleting the index and the files (a write in flight always lies after the cursor). Only while holding
        the lease; returns the names removed."""
        cursor = self.read_cursor()
        if cursor is None:
            return []
        removed = []
        for name in self.uncommitted_checkpoints():
            if checkpoint_position(name)[1] < cursor.cursor - 1:
                self.fs.rm(f"{self._checkpoints}/{name}", recursive=True)
                removed.append(name)
        return removed

    @property
    def _checkpoints(self) -> str:
        return f"{self.path}/{layout.CHECKPOINTS_DIR}"


def _manifest_difference(run_key: str, uri: str, existing: bytes, requested: bytes) -> str:
    try:
        old, new = json.loads(existing), json.loads(requested)
    except ValueError:
        return f"run key {run_key!r} at {uri} holds an unreadable manifest.json; use a new run key"
    keys = sorted(k for k in set(old) | set(new) if k != "content_address" and old.get(k) != new.get(k))
    what = (
        "training data or plan" if old.get("fingerprint") != new.get("fingerprint") else "validation data or settings"
    )
    return (
        f"run key {run_key!r} at {uri} already holds a different manifest (its {what} differ: {', '.join(keys[:8])}); "
        "a run key belongs to exactly one plan. Resume with the original data and config, or choose a new run key"
    )
