"""Serialising the pieces of training state: tensors, RNG streams, pending gradients, weights digests.

Only safetensors and `torch.load(weights_only=True)` are used to read anything back: no arbitrary pickles.
NumPy's RNG key is stored as a tensor so that the weights-only loader accepts it. Tensor files are streamed: the
safetensors layout is written tensor by tensor from the tensors' own memory and read back tensor by tensor into
their destinations (the live parameters where possible), so neither direction holds a whole file in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, cast

import blake3
import numpy as np
import safetensors.torch
import torch

from prefect_gliner2.session_core.checkpoint import VerifiedReader
from prefect_gliner2.session_core.checkpoint import digest as checkpoint_digest
from prefect_gliner2.session_core.errors import CheckpointError

_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_MAX_HEADER = 64 << 20
#: Where a streamed tensor goes: a contiguous CPU tensor of that dtype and shape to fill, or None for a new one.
Destination = Callable[[str, torch.dtype, tuple[int, ...]], "torch.Tensor | None"]


#: safetensors' own file layout (``save_file``): tensors by dtype, this rank descending, then by name.
SAFETENSORS_RANK = {
    torch.bool: 0,
    torch.uint8: 1,
    torch.int8: 2,
    torch.int16: 3,
    torch.float16: 4,
    torch.bfloat16: 5,
    torch.int32: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.int64: 9,
}


def write_tensors(handle: IO[bytes], tensors: Mapping[str, torch.Tensor], *, like_save_file: bool = False) -> None:
    """Stream `tensors` as a safetensors file into `handle`, one tensor at a time (a device tensor is copied to the
    host one tensor at a time; a contiguous CPU tensor is written from its own memory). Tensors are laid out by
    name (checkpoints), or with `like_save_file` as ``safetensors.torch.save_file`` lays them out (by dtype, then
    name), byte for byte the file it writes."""
    items = sorted(tensors.items())
    if like_save_file:
        items.sort(key=lambda item: -SAFETENSORS_RANK.get(item[1].dtype, -1))  # stable: names stay in order
    header: dict[str, Any] = {}
    offset = 0
    for name, tensor in items:
        if tensor.dtype not in _DTYPE_NAMES:
            raise CheckpointError(f"tensor {name} has dtype {tensor.dtype}, which checkpoints cannot store")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    handle.write(struct.pack("<Q", len(raw)))
    handle.write(raw)
    for _, tensor in items:
        if tensor.numel():
            handle.write(_host_bytes(tensor))


def _host_bytes(tensor: torch.Tensor) -> Any:
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.to("cpu")
    return data.contiguous().reshape(-1).view(torch.uint8).numpy()


def read_tensors(
    reader: VerifiedReader,
    *,
    destination: Destination | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
    sink: Callable[[str, torch.Tensor], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Read a streamed safetensors file tensor by tensor. `check(header)` sees names, dtypes and shapes before any
    tensor data is read; `destination` may hand out the tensor to fill (e.g. a live parameter); `sink` takes each
    tensor as soon as it is read (then nothing is kept or returned). The caller's `Checkpoint.open` verifies the
    file's digest once the stream ends."""
    what = f"{reader.name} in {reader.uri}"
    header = _read_header(reader, what)
    if check is not None:
        check({name: (dtype, shape) for name, (dtype, shape, _) in header.items()})
    out: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, size) in header.items():
        target = destination(name, dtype, shape) if destination is not None else None
        if target is None:
            target = torch.empty(shape, dtype=dtype)
        if size:
            reader.readinto(target.detach().reshape(-1).view(torch.uint8).numpy())
        if sink is not None:
            sink(name, target)
        else:
            out[name] = target
    return out


def _read_header(reader: VerifiedReader, what: str) -> dict[str, tuple[torch.dtype, tuple[int, ...], int]]:
    try:
        (length,) = struct.unpack("<Q", reader.read_exact(8))
        if length > min(_MAX_HEADER, reader.expected_bytes):
            raise ValueError(f"header length {length} is impossible")
        raw = json.loads(reader.read_exact(length))
        raw.pop("__metadata__", None)
        entries = sorted(raw.items(), key=lambda item: item[1]["data_offsets"][0])
        header, offset = {}, 0
        for name, info in entries:
            dtype, shape = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            start, end = (int(v) for v in info["data_offsets"])
            size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            if start != offset or end - start != size:
                raise ValueError(f"tensor {name} has data offsets {start}..{end}, expected {offset}..{offset + size}")
            header[name] = (dtype, shape, size)
            offset = end
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{what} is not a valid safetensors file ({type(exc).__name__}: {exc})") from exc
    if 8 + length + offset != reader.expected_bytes:
        raise CheckpointError(f"{what} is not a valid safetensors file (its header does not span the file)")
    return header


def flatten_state(value: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """A nested state dict split into a tensor-free skeleton (tensors replaced by `{"__tensor__": key}`) and the
    tensors by key: the skeleton goes through `torch.save` (small), the tensors are streamed."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(item: Any, key: str) -> Any:
        if isinstance(item, torch.Tensor):
            tensors[key] = item
            return {"__tensor__": key}
        if isinstance(item, dict):
            return {k: walk(v, f"{key}.{k}") for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            walked = [walk(v, f"{key}.{i}") for i, v in enumerate(item)]
            return walked if isinstance(item, list) else tuple(walked)
        return item

    return walk(value, prefix), tensors


def unflatten_state(skeleton: Any, tensors: Mapping[str, torch.Tensor], what: str) -> Any:
    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            if set(item) == {"__tensor__"}:
                try:
                    return tensors[item["__tensor__"]]
                except KeyError:
                    raise CheckpointError(f"{what} names a tensor {item['__tensor__']!r} it does not hold") from None
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        if isinstance(item, tuple):
            return tuple(walk(v) for v in item)
        return item

    return walk(skeleton)


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """safetensors bytes of independent, contiguous CPU copies (tied or shared storages are fine)."""
    return safetensors.torch.save({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()})


def bytes_to_tensors(data: bytes, what: str) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{what} is not a valid safetensors file ({exc})") from exc


def object_to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def bytes_to_object(data: bytes, what: str) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only; any other pickle is refused."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{what} could not be loaded with weights_only=True ({type(exc).__name__}: {str(exc)[:300]}); "
            "checkpoints may hold only tensors and plain containers, never arbitrary pickles"
        ) from exc


def capture_rng(device: torch.device) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Python, NumPy, Torch CPU and (when used) CUDA generator states as (JSON part, tensors)."""
    version, python_key, gauss = random.getstate()
    kind, numpy_key, pos, has_gauss, cached = cast(Any, np.random.get_state())
    meta = {
        "python": {"version": version, "key": list(python_key), "gauss": gauss},
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "cuda_devices": 0,
    }
    tensors = {"torch_cpu": torch.get_rng_state(), "numpy_key": torch.from_numpy(numpy_key.astype(np.int64))}
    if device.type == "cuda":
        states = torch.cuda.get_rng_state_all()
        meta["cuda_devices"] = len(states)
        tensors.update({f"cuda_{i}": state for i, state in enumerate(states)})
    return meta, tensors


def restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    python = meta["python"]
    random.setstate((python["version"], tuple(python["key"]), python["gauss"]))
    numpy = meta["numpy"]
    key = tensors["numpy_key"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], key, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(tensors["torch_cpu"])
    if device.type == "cuda":
        count = int(meta.get("cuda_devices", 0))
        if count != torch.cuda.device_count():
            raise CheckpointError(
                f"checkpoint holds RNG state for {count} CUDA device(s), this machine has {torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all([tensors[f"cuda_{i}"] for i in range(count)])


def capture_grads(named: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """Pending gradients of trainable parameters; a parameter whose grad is None is simply absent (not zero)."""
    return {name: p.grad for name, p in named if p.requires_grad and p.grad is not None}


def restore_grads(named: Iterable[tuple[str, torch.nn.Parameter]], grads: dict[str, torch.Tensor]) -> None:
    params = dict(named)
    unknown = sorted(set(grads) - set(params))
    if unknown:
        raise CheckpointError(f"checkpoint has gradients for parameters this model lacks: {unknown[:5]}")
    for name, parameter in params.items():
        grad = grads.get(name)
        if grad is None:
            parameter.grad = None
            continue
        if grad.shape != parameter.shape or grad.dtype != parameter.dtype:
            raise CheckpointError(
                f"pending gradient {name} is {tuple(grad.shape)}/{grad.dtype}, "
                f"parameter is {tuple(parameter.shape)}/{parameter.dtype}"
            )
        # a tensor read from a checkpoint is ours already: moved when needed, never copied twice
        parameter.grad = grad.to(parameter.device)


def canonical_name(name: str) -> str:
    """A parameter name as the plain gliner2 model spells it, with PEFT wrapping removed."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


#: How a weights digest from `weights_digest` begins; one without it is an older plain sha256 (`tensors_digest`).
WEIGHTS_DIGEST_PREFIX = "blake3:"


def _digest_into(digest: Any, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Names, dtypes, shapes and raw bytes, in name order, read from each CPU tensor's own memory (no copy)."""
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{data.dtype}|{tuple(data.shape)}\n".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().data)


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes, in name order: identifies weights bit-exactly."""
    digest = hashlib.sha256()
    _digest_into(digest, tensors)
    return digest.hexdigest()


def file_tensors_digest(path: str) -> str:
    """`tensors_digest` of the tensors in the safetensors file at `path` (a local file), read one tensor at a time:
    the digest of what was written, without holding a second copy of the weights."""
    digest = hashlib.sha256()
    with safetensors.safe_open(path, framework="pt") as handle:
        for name in sorted(handle.keys()):
            _digest_into(digest, [(name, handle.get_tensor(name))])
    return digest.hexdigest()


def weights_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """`tensors_digest`'s framing hashed with BLAKE3 on the checkpoint hashing threads (several times faster: a
    session hashes its base weights when it is created), as ``blake3:<hex>``."""
    digest = blake3.blake3(max_threads=checkpoint_digest.HASH_THREADS)
    _digest_into(digest, tensors)
    return WEIGHTS_DIGEST_PREFIX + str(digest.hexdigest())


def same_base_weights(recorded: str | None, current: str | None, model: torch.nn.Module) -> bool:
    """Whether a recorded base-weights hash names `model`'s base weights, whose `weights_digest` is `current`. A hash
    recorded before BLAKE3 (plain sha256 hex, no prefix) is checked against the older digest of the same weights."""
    if recorded == current:
        return True
    if recorded is None or current is None or recorded.startswith(WEIGHTS_DIGEST_PREFIX):
        return False
    return recorded == tensors_digest(base_weights(model))


def base_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The base model's tensors (everything but LoRA adapter parameters), under canonical names."""
    out = []
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        out.append((canonical_name(name), tensor))
    return out
