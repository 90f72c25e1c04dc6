"""Building a session worker's training run from its spec: plan, model, session, init weights, restored checkpoint.

Runs in the worker process (torch and gliner2 load here, inside ``build_training``): it pins the torch and hashing
thread counts, reads the run's manifest, loads the model (an init-weights export as the frozen base of new LoRA
adapters), runs the pre-flight on a span model (``runtime.preflight``: a dead count head stops the run), builds the
TrainingSession and ManagedTraining, then restores the checkpoint it is given, or loads the init weights of a fresh
run. A checkpoint to restore starts reading before the model loads (its optimizer moments and gradients, in a
background thread), so that most of a resume's reading overlaps the model's construction; a worker that learns its
checkpoint before it has imported gliner2 starts it even earlier (``head_start``, from ``runtime.worker_child``), so
that the reading overlaps those imports too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_gliner2.runtime.model_sources import load_model
from prefect_gliner2.runtime.protocol import WorkerSpec
from prefect_gliner2.session_core import layout, storage
from prefect_gliner2.session_core.checkpoint import discard_prefetch, set_hash_threads

if TYPE_CHECKING:
    from prefect_gliner2.session_core.plan import ManagedTrainingPlan
    from prefect_gliner2.training.managed import ManagedTraining

__all__ = ["build_training", "head_start", "init_weights_dir"]


def head_start(spec: WorkerSpec, restore_uri: str | None) -> None:
    """Pin the torch and hashing thread counts, and start reading the checkpoint to restore in the background (see
    ``_prefetch``). Imports only torch and the checkpoint reader: a worker calls it as soon as its run arrives, before
    it imports gliner2 and transformers, when the run arrives that early."""
    import torch

    torch.set_num_threads(int(spec.cpu_threads))
    set_hash_threads(int(spec.cpu_threads))  # checkpoint hashing stays within the slot's CPU share too
    if restore_uri:
        _prefetch(restore_uri)


def build_training(
    spec: WorkerSpec, restore_uri: str | None, *, head_started: bool = False
) -> tuple[ManagedTrainingPlan, ManagedTraining]:
    """The worker's plan and managed run, restored from `restore_uri` when given (see the module docstring).
    `head_started`: ``head_start(spec, restore_uri)`` ran already in this process."""
    if not head_started:
        head_start(spec, restore_uri)
    try:
        return _build(spec, restore_uri)
    finally:
        discard_prefetch()  # taken by the restore; dropped when the build failed before it


def _build(spec: WorkerSpec, restore_uri: str | None) -> tuple[ManagedTrainingPlan, ManagedTraining]:
    from prefect_gliner2.training import ManagedTraining, ManagedTrainingPlan, TrainingSession

    loaded = ManagedTrainingPlan.from_manifest(spec.manifest_uri)
    plan = loaded.plan
    lora = bool(plan.config.use_lora)
    init = init_weights_dir(spec.init_weights, lora) if spec.init_weights else None
    # New LoRA adapters over a full model's weights: that model *is* the frozen base, on a fresh start and on
    # every restore alike (a restore checks the base weights' hash), so load it as the base model.
    base_from_init = init is not None and lora and _is_native_model_dir(init)
    model = load_model(init if base_from_init and init is not None else spec.model)
    if plan.architecture == "span" and (init is None or base_from_init):
        _preflight(model, plan, init if base_from_init and init is not None else spec.model)
    session = TrainingSession(model, plan.config, max_steps=plan.max_steps, device=spec.device)
    evals = loaded.eval_examples
    run = ManagedTraining(session, plan, eval_examples=evals if evals else None)
    if restore_uri:
        _restore(run, restore_uri)  # restores everything, including what init_weights had loaded
    elif init is not None and not base_from_init:
        session.load_weights(init)
    return plan, run


def _preflight(model: Any, plan: ManagedTrainingPlan, source: str) -> None:
    """The count-head pre-flight (``runtime.preflight``) on a few training records, before any compute is spent; a
    model that full init weights replace afterwards was checked when those weights were trained."""
    from prefect_gliner2.runtime.preflight import PROBE_RECORDS, check_count_head

    examples = [plan.records[row].example for row in range(min(PROBE_RECORDS, len(plan.records)))]
    check_count_head(model, examples, repair=bool(plan.config.repair_count_head), source=source)


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


def _prefetch(uri: str) -> None:
    """Read the checkpoint's optimizer moments, gradients, RNG and best weights in the background while the model
    loads (``session_core.prefetch.prefetch_state``). Only a head start: when it cannot start (e.g. a
    damaged index), the restore reads the checkpoint itself and reports what is wrong as it always does."""
    from prefect_gliner2.training.prefetch import prefetch_state

    try:
        prefetch_state(uri)
    except Exception:  # noqa: BLE001, S110 - the restore below meets the same problem and raises it properly
        pass


def _restore(run: Any, uri: str) -> None:
    """`run.load_state(uri)`, the only full read of a checkpoint on resume (verified as it streams). A failure that
    may come from damaged bytes (e.g. a header parsed before its file's hash is complete) is re-checked by streaming
    the checkpoint through its hashes once more: damage raises CheckpointDamagedError (the flow then falls back to
    the previous checkpoint), anything else is raised as it was."""
    from prefect_gliner2.session_core.checkpoint import read_checkpoint
    from prefect_gliner2.session_core.errors import CheckpointDamagedError

    try:
        run.load_state(uri)
    except CheckpointDamagedError:
        raise
    except Exception as exc:
        try:
            read_checkpoint(uri, min_version=1)
        except CheckpointDamagedError as damage:
            raise damage from exc
        except Exception:  # noqa: BLE001 - not damage: the original error says what is wrong
            pass
        raise
