"""Changes to a model directory already written: keys of its config, one element of a tensor."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from support.tiny_models.base import _FLOAT_DTYPES, _encode
from support.tiny_models.tensors import _DTYPE_SIZE


def rewrite_config(dest: Path, **changes: Any) -> Path:
    """config.json of a model directory with some keys changed; the directory."""
    path = dest / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dest


def set_value(dest: Path, tensor: str, index: int, value: float) -> Path:
    """Overwrite element `index` (row-major) of a float tensor in dest's safetensors files with `value`, in place."""
    names = {code: name for name, code in _FLOAT_DTYPES.items()}
    for path in sorted(Path(dest).glob("*.safetensors")):
        with open(path, "r+b") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            info = json.loads(handle.read(length)).get(tensor)
            if info is None:
                continue
            if not 0 <= index < math.prod(info["shape"]):
                raise IndexError(f"{tensor} has {math.prod(info['shape'])} elements, not {index + 1}")
            handle.seek(8 + length + info["data_offsets"][0] + index * _DTYPE_SIZE[info["dtype"]])
            handle.write(_encode(np.asarray([value], dtype=np.float64), names[info["dtype"]]))
        return dest
    raise KeyError(f"no safetensors file in {dest} holds {tensor}")
