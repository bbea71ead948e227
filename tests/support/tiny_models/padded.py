"""A bfloat16 llama of a chosen total size, for what needs many bytes rather than a useful model: its matrices
repeat one block of random values, so that gigabytes are written at disk speed."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from support.tiny_models.base import _encode, _init_values, _normal, _prepare_dest, _split_max_bytes
from support.tiny_models.llama import _causal_shapes, _CausalSpec, _write_causal_model
from support.tiny_models.tensors import TensorData, _Tensor

_REPEAT_BLOCK_BYTES = 1 << 20
_HEADER_BYTES_PER_TENSOR = 112


def _repeat_writer(block: bytes, nbytes: int, start: int) -> Callable[[BinaryIO], None]:
    """Return a callback writing nbytes by cycling through block from offset start."""

    def write(handle: BinaryIO) -> None:
        """Write the repeated block."""
        view = memoryview(block)
        position = start % len(block)
        remaining = nbytes
        while remaining:
            take = min(remaining, len(block) - position)
            handle.write(view[position : position + take])
            remaining -= take
            position = 0

    return write


def _padded_spec(total_bytes: int) -> _CausalSpec:
    """Choose a bfloat16 llama architecture whose safetensors files total about total_bytes."""

    def layout(hidden: int) -> tuple[int, int, int, int]:
        """Return heads, kv heads, intermediate size and per-layer bytes for hidden."""
        heads = max(1, hidden // 64)
        kv_heads = heads // 4 if heads >= 4 else heads
        multiple = 256 if hidden >= 1024 else 64
        intermediate = -(-8 * hidden // (3 * multiple)) * multiple
        params = 2 * hidden * hidden + 2 * hidden * kv_heads * (hidden // heads)
        params += 3 * hidden * intermediate + 2 * hidden
        return heads, kv_heads, intermediate, 2 * params + _HEADER_BYTES_PER_TENSOR * 9

    min_vocab = 320
    candidates = [64 << shift for shift in range(8)]
    hidden = candidates[0]
    for option in candidates:
        embed = 2 * (2 * min_vocab * option) + 2 * option
        if embed + 8 * layout(option)[3] <= total_bytes:
            hidden = option
    heads, kv_heads, intermediate, layer_bytes = layout(hidden)
    fixed = 2 * (2 * min_vocab * hidden) + 2 * hidden + 3 * _HEADER_BYTES_PER_TENSOR
    layers = (total_bytes - fixed) // layer_bytes
    if layers < 1:
        raise ValueError(f"total_bytes must be at least {fixed + layer_bytes}")
    spare = total_bytes - layers * layer_bytes - 2 * hidden - 3 * _HEADER_BYTES_PER_TENSOR
    vocab = spare // (2 * 2 * hidden)
    return _CausalSpec(
        model_type="llama",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def build_padded_model(dest: Path, total_bytes: int, *, seed: int = 0, shard_bytes: int = 1 << 30) -> Path:
    """Write a bfloat16 llama directory whose safetensors shards add up to about total_bytes."""
    spec = _padded_spec(total_bytes)
    block = _encode(0.02 * _normal(seed, "padding-block", _REPEAT_BLOCK_BYTES // 2), "bfloat16")
    tensors: list[_Tensor] = []
    for index, (name, shape) in enumerate(_causal_shapes(spec)):
        nbytes = math.prod(shape) * 2
        data: TensorData
        if len(shape) == 1:
            data = _encode(_init_values(seed, name, shape), "bfloat16")
        else:
            data = _repeat_writer(block, nbytes, 2 * index * 7919)
        tensors.append(_Tensor(name, "BF16", shape, nbytes, data))
    groups = _split_max_bytes(tensors, shard_bytes)
    dest = _prepare_dest(dest)
    _write_causal_model(dest, spec, groups, "padded-llama", seed)
    return dest
