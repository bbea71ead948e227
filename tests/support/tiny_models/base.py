"""What the model families share: the transformers release imitated, reproducible random weights, and the files
of a model directory (weights in one file or shards, JSON as save_pretrained writes it, a model card)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from support.tiny_models.tensors import _Tensor, write_safetensors

TRANSFORMERS_VERSION = "4.51.3"
"""The transformers release whose save_pretrained output the JSON files imitate."""

FloatArray: TypeAlias = npt.NDArray[np.float64]

_FLOAT_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ST_METADATA = {"format": "pt"}


def _normal(seed: int, name: str, count: int) -> FloatArray:
    """Return count approximately standard-normal values, reproducible on any numpy/platform."""
    digest = hashlib.sha256(f"{seed}\x00{name}".encode()).digest()
    bitgen = np.random.PCG64(int.from_bytes(digest[:16], "little"))
    out = np.empty(count, dtype=np.float64)
    chunk = 1 << 15
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        raw = np.asarray(bitgen.random_raw(size * 12), dtype=np.uint64).reshape(12, size)
        # Irwin-Hall: the sum of 12 uniforms minus 6 has mean 0 and variance 1.  Summing the
        # 53-bit integers is exact, so the result does not depend on float summation order.
        total = (raw >> np.uint64(11)).sum(axis=0, dtype=np.uint64)
        out[start : start + size] = total.astype(np.float64) * 2.0**-53 - 6.0
    return out


def _encode(values: FloatArray, dtype: str) -> bytes:
    """Return float values as little-endian float32, float16 or bfloat16 bytes."""
    f32 = values.astype("<f4")
    if dtype == "float32":
        return f32.tobytes()
    if dtype == "float16":
        return f32.astype("<f2").tobytes()
    if dtype == "bfloat16":
        bits = f32.view("<u4").astype(np.uint32)
        rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        return ((bits + rounding) >> np.uint32(16)).astype("<u2").tobytes()
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_FLOAT_DTYPES)}")


def _init_values(seed: int, name: str, shape: tuple[int, ...]) -> FloatArray:
    """Return HF-like initial values: ones-ish for norm weights, small normal noise otherwise."""
    count = math.prod(shape)
    noise = _normal(seed, name, count)
    is_norm = "norm" in name.lower()
    if is_norm and name.endswith(".weight"):
        return 1.0 + 0.01 * noise
    if is_norm:
        return 0.01 * noise
    return 0.02 * noise


def _prepare_dest(dest: Path) -> Path:
    """Create dest, which must be absent or empty, and return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    return dest


def _write_json(path: Path, obj: Any, *, sort_keys: bool = True, newline: bool = True) -> None:
    """Write obj as two-space-indented UTF-8 JSON, as transformers' save_pretrained does."""
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False)
    path.write_bytes((text + ("\n" if newline else "")).encode("utf-8"))


def _split_even(tensors: Sequence[_Tensor], shards: int) -> list[list[_Tensor]]:
    """Split tensors, in order, into exactly shards non-empty groups of similar byte size."""
    if not 1 <= shards <= len(tensors):
        raise ValueError(f"shards must be between 1 and {len(tensors)}, got {shards}")
    total = sum(tensor.nbytes for tensor in tensors)
    groups: list[list[_Tensor]] = []
    index = 0
    done = 0
    for shard in range(shards):
        group = [tensors[index]]
        done += tensors[index].nbytes
        index += 1
        if shard == shards - 1:
            group.extend(tensors[index:])
            index = len(tensors)
        else:
            boundary = total * (shard + 1) / shards
            while len(tensors) - index > shards - 1 - shard and done + tensors[index].nbytes <= boundary:
                group.append(tensors[index])
                done += tensors[index].nbytes
                index += 1
        groups.append(group)
    return groups


def _split_max_bytes(tensors: Sequence[_Tensor], max_bytes: int) -> list[list[_Tensor]]:
    """Split tensors, in order, into groups of at most max_bytes, as save_pretrained does."""
    if max_bytes <= 0:
        raise ValueError("shard_bytes must be positive")
    groups: list[list[_Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if groups[-1] and size + tensor.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.nbytes
    return groups


def _write_weights(dest: Path, groups: Sequence[Sequence[_Tensor]]) -> list[str]:
    """Write model.safetensors, or numbered shards plus their index, and return the file names."""
    if len(groups) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, group in zip(names, groups, strict=True):
        entries = [(t.name, t.code, t.shape, t.data) for t in group]
        write_safetensors(dest / name, entries, metadata=_ST_METADATA)
    if len(groups) > 1:
        weight_map = {t.name: name for name, group in zip(names, groups, strict=True) for t in group}
        total_size = sum(t.nbytes for group in groups for t in group)
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        _write_json(dest / "model.safetensors.index.json", index)
    return names


def _write_readme(dest: Path, title: str, front_matter: dict[str, str], lines: Sequence[str]) -> None:
    """Write a short model card with YAML front matter."""
    header = ["---", *(f"{key}: {value}" for key, value in front_matter.items()), "tags:", "- test-fixture", "---"]
    body = [
        f"# {title}",
        "",
        "Randomly initialised test fixture written by `tests/tiny_models.py` for the mreg test suite.",
        "It is not trained: it loads and runs, but its outputs are noise.",
        "",
        *(f"- {line}" for line in lines),
    ]
    dest.joinpath("README.md").write_bytes(("\n".join([*header, "", *body]) + "\n").encode("utf-8"))
