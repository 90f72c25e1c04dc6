"""The session worker process: owns one TrainingSession + ManagedTraining and runs operations strictly in order.

Started by ``prefect_gliner2.runtime.worker.SessionWorker`` in a spawn-context child. It dies with its parent (Linux
PR_SET_PDEATHSIG, plus a watchdog on ``os.getppid()`` and pipe EOF), pins the torch thread count, builds the
session from the run's manifest and restores the checkpoint it is given before answering anything.

Every operation names a *position* in the plan and is idempotent: ``advance(first, through)`` trains (and runs due
validations) until the cursor is past ``through``, replaying from a restored cursor when behind and only
reporting recorded history when already past; ``validate``, ``checkpoint`` and ``export`` first advance to their
position. So a skipped (cached) or repeated operation can never leave the session behind the plan.

Importing this module is cheap (torch loads inside ``SessionRunner``), so the flow process can reference
``worker_main`` as the spawn target without importing torch.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect_gliner2.runtime import faults
from prefect_gliner2.runtime.errors import permanent_storage_errno
from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.session_core import layout, storage

PR_SET_PDEATHSIG = 1
_WATCHDOG_SECONDS = 0.5


def worker_main(conn: Any, parent_pid: int) -> None:
    """Entry point of the child process (see the module docstring)."""
    _die_with_parent(parent_pid)
    _quiet_logging()
    try:
        _, spec, restore = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    try:
        runner = SessionRunner(spec, restore)
    except BaseException as exc:  # noqa: BLE001 - reported to the client, then this process exits
        _reply_error(conn, 0, exc)
        os._exit(2)
    conn.send((0, "ok", runner.op_status()))
    _serve(conn, runner)


def _serve(conn: Any, runner: SessionRunner) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone
        if message[0] == "close":
            runner.close()
            conn.close()
            return  # a normal exit: multiprocessing's finalizers release what the libraries registered
        op_id, op, args = message
        try:
            result = getattr(runner, f"op_{op}")(**args)
        except BaseException as exc:  # noqa: BLE001 - a worker that raised is never reused
            _reply_error(conn, op_id, exc)
            os._exit(3)
        conn.send((op_id, "ok", result))


def _reply_error(conn: Any, op_id: int, exc: BaseException) -> None:
    payload = {
        "module": type(exc).__module__,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "storage_errno": permanent_storage_errno(exc),
    }
    try:
        conn.send((op_id, "error", payload))
        conn.close()
    except (OSError, ValueError):
        pass


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(70)

    def watch() -> None:
        while True:
            time.sleep(_WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(70)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _quiet_logging() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s session-worker %(levelname)s %(message)s")


class SessionRunner:
    """The operations a worker executes, over one ManagedTraining."""

    def __init__(self, spec: dict[str, Any], restore_uri: str | None) -> None:
        import torch

        torch.set_num_threads(int(spec["cpu_threads"]))
        from prefect_gliner2.session_core import ManagedTraining, ManagedTrainingPlan, TrainingSession

        loaded = ManagedTrainingPlan.from_manifest(spec["manifest_uri"])
        self.plan = loaded.plan
        lora = bool(self.plan.config.use_lora)
        init = init_weights_dir(str(spec["init_weights"]), lora) if spec.get("init_weights") else None
        # New LoRA adapters over a full model's weights: that model *is* the frozen base, on a fresh start and on
        # every restore alike (a restore checks the base weights' hash), so load it as the base model.
        base_from_init = init is not None and lora and _is_native_model_dir(init)
        model = load_model(init if base_from_init and init is not None else str(spec["model"]))
        session = TrainingSession(model, self.plan.config, max_steps=self.plan.max_steps, device=spec.get("device"))
        evals = loaded.eval_examples
        self.run = ManagedTraining(session, self.plan, eval_examples=evals if evals else None)
        self.restored_from = restore_uri
        if restore_uri:
            self.run.load_state(restore_uri)  # restores everything, including what init_weights had loaded
        elif init is not None and not base_from_init:
            session.load_weights(init)
        self.threads = torch.get_num_threads()

    # ---- positions -----------------------------------------------------------------------------------------

    def _advance(self, through: int, first: int | None = None) -> int:
        """Train (and validate when due) until the cursor is past `through`; returns batches replayed before `first`."""
        run, replayed = self.run, 0
        while not run.finished and run.cursor <= through:
            if run.validation_due:
                self._validate()
                continue
            index = run.cursor
            faults.hit("batch", index)
            run.train_batch()
            if first is not None and index < first:
                replayed += 1
        return replayed

    def _validate(self) -> dict[str, Any]:
        faults.hit("validate", self.run.cursor - 1)
        return self.run.validate()

    # ---- operations ----------------------------------------------------------------------------------------

    def op_status(self) -> dict[str, Any]:
        run = self.run
        return {
            "pid": os.getpid(),
            "cursor": run.cursor,
            "step": run.session.step,
            "finished": run.finished,
            "validation_due": run.validation_due,
            "stopped_early": run.stopped_early,
            "restored_from": self.restored_from,
            "cpu_threads": self.threads,
            "device": str(run.session.device),
            "batch_count": self.plan.batch_count,
        }

    def op_advance(self, first: int, through: int) -> dict[str, Any]:
        replayed = self._advance(through, first)
        run = self.run
        last = min(through, self.plan.batch_count - 1)
        return {
            "first": first,
            "through": through,
            "cursor": run.cursor,
            "step": run.session.step,
            "epoch": self.plan.epoch(last),
            "replayed": replayed,
            "stopped_early": run.stopped_early,
            "updates": [h for h in run.train_metrics_history if first <= h["batch"] <= through],
        }

    def op_validate(self, index: int) -> dict[str, Any]:
        run = self.run
        self._advance(index)
        if run.validation_due and run.cursor == index + 1:
            metrics: dict[str, Any] | None = self._validate()
        else:
            metrics = next((h for h in run.eval_metrics_history if h["batch"] == index), None)
        return {
            "index": index,
            "metrics": metrics,
            "best_metric": run.best_metric,
            "best_step": run.best_step,
            "stopped_early": run.stopped_early,
            "step": run.session.step,
            "history": list(run.eval_metrics_history),
        }

    def op_checkpoint(self, index: int, uri: str) -> dict[str, Any]:
        run = self.run
        self._advance(index)
        if run.validation_due and run.cursor == index + 1:
            self._validate()
        info = {
            "uri": uri,
            "index": index,
            "cursor": run.cursor,
            "step": run.session.step,
            "epoch": self.plan.epoch(index),
            "finished": run.finished,
            "stopped_early": run.stopped_early,
            "best_metric": run.best_metric,
            "best_step": run.best_step,
        }
        if run.cursor != index + 1:
            return {
                **info,
                "committed": False,
                "reason": f"the session is at cursor {run.cursor}, past batch {index}; nothing to write there",
            }
        existing = _committed_meta(uri)
        if existing is not None:
            if existing.get("plan_fingerprint") != self.plan.fingerprint or existing.get("cursor") != run.cursor:
                raise _checkpoint_conflict(uri, existing, run.cursor)
            return {**info, "committed": True, "existing": True}
        storage.remove_uncommitted(uri)  # debris of an interrupted write of this checkpoint (we hold the lease)
        faults.hit("checkpoint", index)
        with _write_hook("checkpoint-write", index):
            digest = run.save_state(uri)
        return {**info, "committed": True, "existing": False, "index_sha256": digest}

    def op_export(self, uri: str, which: str = "best") -> dict[str, Any]:
        run = self.run
        self._advance(self.plan.batch_count - 1)
        if run.validation_due:
            self._validate()
        label = "best" if which == "best" and run.best_state is not None else "final"
        existing = _existing_export(uri)
        if existing is not None:
            if existing.get("label") != label or existing.get("step") != run.session.step:
                from prefect_gliner2.session_core.errors import WeightsError

                raise WeightsError(
                    f"export destination {uri} already holds a different model ({existing.get('label')} "
                    f"at step {existing.get('step')}); choose a new export location"
                )
            info = dict(existing)
        else:
            with _write_hook("export-write", self.plan.batch_count - 1):
                info = run.export_weights(uri, which=which)
        return {**info, "uri": uri, "label": label, **self.op_summary()}

    def op_summary(self) -> dict[str, Any]:
        """The native summary without the per-step training history (validation history is small: kept)."""
        result = self.run.result()
        result.pop("train_metrics_history", None)
        return result

    def close(self) -> None:
        self.run.close()


def init_weights_dir(uri: str, lora: bool) -> str:
    """The directory load_weights should read: an export directory's adapter/ for a LoRA run, else `uri` itself."""
    fs, path = storage.resolve(uri)
    if lora and fs.exists(f"{path}/{layout.ADAPTER_DIR}/{layout.ADAPTER_CONFIG_FILE}"):
        return f"{uri.rstrip('/')}/{layout.ADAPTER_DIR}"
    return uri


def _is_native_model_dir(uri: str) -> bool:
    """A plain native model directory (not a checkpoint, not a PEFT adapter)."""
    fs, path = storage.resolve(uri)
    return (
        fs.exists(f"{path}/{layout.MODEL_CONFIG_FILE}")
        and not fs.exists(f"{path}/{layout.CHECKPOINT_INDEX_FILE}")
        and not fs.exists(f"{path}/{layout.ADAPTER_CONFIG_FILE}")
    )


def _committed_meta(uri: str) -> dict[str, Any] | None:
    fs, path = storage.resolve(uri)
    index = f"{path}/{layout.CHECKPOINT_INDEX_FILE}"
    if not fs.exists(index):
        return None
    meta = json.loads(fs.cat_file(index)).get("meta", {})
    return meta if isinstance(meta, dict) else {}


def _existing_export(uri: str) -> dict[str, Any] | None:
    fs, path = storage.resolve(uri)
    marker = f"{path}/{layout.EXPORT_MARKER_FILE}"
    return json.loads(fs.cat_file(marker)) if fs.exists(marker) else None


def _checkpoint_conflict(uri: str, meta: dict[str, Any], cursor: int) -> Exception:
    from prefect_gliner2.session_core.errors import CheckpointError

    return CheckpointError(
        f"{uri} already holds a checkpoint of plan {str(meta.get('plan_fingerprint'))[:12]} at cursor "
        f"{meta.get('cursor')}, but this run would write cursor {cursor}; the run directory was modified by hand "
        "or shared between runs: start a new run key"
    )


@contextmanager
def _write_hook(point: str, index: int) -> Iterator[None]:
    """Test hooks `checkpoint-write` / `export-write`: fire when the files are complete, just before the commit
    (local storage: the rename), or mid-upload on object storage (after the first object, before the marker)."""
    if not faults.active():
        yield
        return
    original = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if layout.STAGING_MARKER in os.path.basename(os.fspath(src)):
            faults.hit(point, index)
        original(src, dst, *args, **kwargs)

    os.rename = rename  # type: ignore[assignment]
    storage.set_upload_hook(lambda what: faults.hit(point, index))
    try:
        yield
    finally:
        os.rename = original
        storage.set_upload_hook(None)
