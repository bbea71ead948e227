"""Safetensors files laid out byte for byte as `safetensors.save_file` lays them out, and random ones."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

TensorData: TypeAlias = bytes | Callable[[BinaryIO], None]
"""A tensor's raw little-endian bytes, or a callback that writes exactly that many bytes."""

TensorEntry: TypeAlias = tuple[str, str, tuple[int, ...], TensorData]
"""One tensor for write_safetensors: name, dtype, shape and data."""

# Safetensors dtypes in the order of the crate's Dtype enum (it lays data out by descending
# rank, then by name), with their item sizes.  Sub-byte dtypes (F4, F6_*) are left out.
_DTYPE_ORDER: tuple[tuple[str, int], ...] = (
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("F8_E5M2", 1),
    ("F8_E4M3", 1),
    ("F8_E8M0", 1),
    ("I16", 2),
    ("U16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("I32", 4),
    ("U32", 4),
    ("F32", 4),
    ("C64", 8),
    ("F64", 8),
    ("I64", 8),
    ("U64", 8),
)
_DTYPE_RANK = {code: rank for rank, (code, _) in enumerate(_DTYPE_ORDER)}
_DTYPE_SIZE = dict(_DTYPE_ORDER)
_DTYPE_ALIASES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}


@dataclass(frozen=True)
class _Tensor:
    """A tensor to write: name, safetensors dtype code, shape, byte size and data."""

    name: str
    code: str
    shape: tuple[int, ...]
    nbytes: int
    data: TensorData


def _dtype_code(dtype: str) -> str:
    """Return the safetensors code ("F32") for a code or a numpy-style name ("float32")."""
    if dtype in _DTYPE_RANK:
        return dtype
    code = _DTYPE_ALIASES.get(dtype)
    if code is None:
        raise ValueError(f"unsupported safetensors dtype {dtype!r}")
    return code


def _safetensors_header(tensors: Sequence[_Tensor], metadata: dict[str, str] | None) -> bytes:
    """Return the length-prefixed, space-padded JSON header for tensors already in file order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("safetensors metadata keys and values must be str")
        header["__metadata__"] = {key: metadata[key] for key in sorted(metadata)}
    offset = 0
    for tensor in tensors:
        end = offset + tensor.nbytes
        header[tensor.name] = {
            "dtype": tensor.code,
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _prepare_tensors(tensors: Iterable[TensorEntry]) -> list[_Tensor]:
    """Validate tensor entries and sort them into safetensors' data order."""
    prepared: list[_Tensor] = []
    seen: set[str] = set()
    for name, dtype, shape, data in tensors:
        if name == "__metadata__" or name in seen:
            raise ValueError(f"invalid or duplicate tensor name {name!r}")
        seen.add(name)
        code = _dtype_code(dtype)
        dims = tuple(int(dim) for dim in shape)
        if any(dim < 0 for dim in dims):
            raise ValueError(f"negative dimension in shape {dims} of {name!r}")
        nbytes = math.prod(dims) * _DTYPE_SIZE[code]
        if isinstance(data, (bytes, bytearray, memoryview)):
            if len(data) != nbytes:
                raise ValueError(f"{name!r}: {len(data)} bytes given, {nbytes} expected")
        elif not callable(data):
            raise TypeError(f"{name!r}: data must be bytes or a callable")
        prepared.append(_Tensor(name, code, dims, nbytes, data))
    prepared.sort(key=lambda tensor: (-_DTYPE_RANK[tensor.code], tensor.name))
    return prepared


def write_safetensors(
    path: Path,
    tensors: Iterable[tuple[str, str, tuple[int, ...], bytes | Callable[[BinaryIO], None]]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Stream tensors into a safetensors file laid out byte for byte as safetensors.save_file does."""
    prepared = _prepare_tensors(tensors)
    header = _safetensors_header(prepared, metadata)
    try:
        with open(path, "wb") as handle:
            handle.write(header)
            for tensor in prepared:
                start = handle.tell()
                if isinstance(tensor.data, (bytes, bytearray, memoryview)):
                    handle.write(tensor.data)
                else:
                    tensor.data(handle)
                written = handle.tell() - start
                if written != tensor.nbytes:
                    raise ValueError(f"{tensor.name!r}: callback wrote {written} bytes, {tensor.nbytes} expected")
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


def random_safetensors(size: int, seed: int = 0) -> bytes:
    """A valid safetensors file holding `size` random bytes as one U8 tensor (no float for a NaN scan to read)."""
    import random

    header = _safetensors_header(_prepare_tensors([("weight", "U8", (size,), lambda _: None)]), None)
    return header + random.Random(seed).randbytes(size)


def write_random_safetensors(path: Path, size: int, seed: int = 0) -> Path:
    """random_safetensors(size, seed) written to `path`."""
    path.write_bytes(random_safetensors(size, seed))
    return path
