"""The engine adapter: the only package that touches gliner2's internals (its trainer's and its models').

`SessionEngine` subclasses gliner2's `ExtractorTrainer` and drives its own methods one bounded operation at a
time: `_backward_one` for a micro-batch, `_renormalize_partial_accumulation` + `_optimizer_step` for an update,
`_create_optimizer` and `get_scheduler` for the optimizer and schedule, `ExtractorCollator` for preprocessing. It
never calls `train()`, `_prepare_data`, `_create_dataloader`, `_evaluate`, `_save_checkpoint` or
`load_checkpoint` (they reseed global RNGs, reorder data, write files, or perturb live weights).

What this adapter adds, because the native engine lacks it:
- an explicit device and precision (no CPU AMP downgrade, no fp16, bf16 only when hardware-native);
- no files written and no logging reconfigured at construction;
- non-reentrant activation checkpointing;
- preloaded PEFT adapters validated against the configuration and continued without re-initialisation;
- guards: a sample the span model could not process, a missing loss, a loss that does not require grad while
  parameters are trainable, a non-finite loss, and non-finite gradients all raise instead of being zeroed (the
  gradient guard reads the norm native clipping computes anyway: no second pass over the gradients);
- the boundary head's schedule scalars re-applied from the counters (they are not in `state_dict`).

Modules, by concern (each says which gliner2 internals it touches):

    trainer.py    SessionEngine: the step operations (prepare, backward, step, evaluate_loss, extract)  internals
    setup.py      EngineSetup: construction, the native set-up hooks overridden, LoRA, collators        internals
    state.py      EngineState: counters and the boundary head's schedule scalars                        internals
    guards.py     EngineGuards: the forward and optimizer hooks that refuse lossy paths                 internals
    lora.py       unwrapping PEFT models, adapter parameters, adapter checks (gliner2's target resolution)
    rng.py        the session's private Python stream for gliner2's preprocessing; blocks that draw nothing
    precision.py  device and precision checks, process-wide determinism, gliner2's public TrainingConfig
    identity.py   what identifies a model for state compatibility (its classes, shapes, processor sampling)  internals
    native.py     what the rest of the product uses of gliner2's models: count head, word splitter and chunking,
                  the tokenizer, the save_file binding native saves go through                             internals
    onnx_graphs.py  a span model's four graphs as the gliner2-onnx runtime runs them (encoder, span rep, count
                  embedding, classifier), and what keeps a model from that runtime                          internals
    windows.py    gliner2's word splitter, long-text windows and their merge, for the ONNX runtime's extraction

`SessionEngine` composes the three partial trainers (`EngineGuards`, `EngineState`, `EngineSetup`, each an
`ExtractorTrainer` subclass with no state of its own) ahead of any native trainer subclass a session composes it
with, so their methods take precedence exactly as when they were one class.
"""

from __future__ import annotations

from gliner2.training.trainer import ExtractorTrainer

from prefect_gliner2.training.engine.lora import (
    expected_targets,
    is_adapter_parameter,
    is_peft,
    unwrap,
    validate_adapter,
    validate_adapter_config,
)
from prefect_gliner2.training.engine.precision import configure_determinism, native_config, resolve_device
from prefect_gliner2.training.engine.rng import preserved_rng, private_python_rng
from prefect_gliner2.training.engine.setup import configure_sampling
from prefect_gliner2.training.engine.trainer import LOSS_KEYS, Pair, SessionEngine

# The public path: a checkpoint records its trainer's qualified name (the session's compat "trainer", checked on
# restore), and checkpoints written before the adapter became a package name this one.
SessionEngine.__module__ = __name__
#: The names this trainer had in checkpoints written by earlier layouts (before the torch layer left session_core):
#: a checkpoint naming one of them was written by this same trainer and restores.
FORMER_TRAINER_NAMES = frozenset({"prefect_gliner2.session_core.engine.SessionEngine"})

__all__ = [
    "FORMER_TRAINER_NAMES",
    "LOSS_KEYS",
    "ExtractorTrainer",
    "Pair",
    "SessionEngine",
    "configure_determinism",
    "configure_sampling",
    "expected_targets",
    "is_adapter_parameter",
    "is_peft",
    "native_config",
    "preserved_rng",
    "private_python_rng",
    "resolve_device",
    "unwrap",
    "validate_adapter",
    "validate_adapter_config",
]
