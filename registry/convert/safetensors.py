"""safetensors headers, read as hostile input: every size is checked against the file before anything is allocated.

A file is 8 bytes of little-endian header length, a JSON header, then the tensors' bytes. The
header must be a JSON object whose entries each give a known dtype, a shape of whole numbers
and data offsets inside the body that match the shape's size, do not overlap and leave no byte
unaccounted for (what the safetensors loaders accept); anything else is `InvalidSafetensors`
(exit 4), naming the file and the tensor, before a converter reads a row.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from registry.errors import IntegrityError

#: Bytes per element of every dtype the safetensors format defines.
ITEM_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: The format's own limit on the header (100 MB): a larger length is damage, not a model.
MAX_HEADER = 100_000_000


class InvalidSafetensors(IntegrityError):
    """A safetensors file whose header or layout does not describe its bytes."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path.name if isinstance(path, Path) else path} is not a valid safetensors file: {problem}",
                         hint="the checkpoint is damaged or not safetensors: fetch it again from its source; "
                              "nothing was written")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header places it: dtype, shape, and its bytes' absolute offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def read_header(path: Path, label: str | None = None) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file, every entry checked against the file's size; errors name `label`
    (the file's path in its snapshot) when given, else the file's name."""
    name: Path | str = label or path
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InvalidSafetensors(name, f"{size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise InvalidSafetensors(name, f"header length {length} past the end of the file ({size} bytes)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise InvalidSafetensors(name, f"the header is not JSON ({str(e) or type(e).__name__})") from None
    if not isinstance(header, dict):
        raise InvalidSafetensors(name, "the header is not a JSON object")
    body = size - 8 - length
    entries = [_entry(name, key, info, 8 + length, body) for key, info in header.items() if key != "__metadata__"]
    _check_layout(name, entries, 8 + length, size)
    return {e.name: e for e in entries}


def _entry(path: Path | str, name: str, info: object, base: int, body: int) -> TensorEntry:
    """One header entry, or the reason it is not one."""
    if not isinstance(info, dict):
        raise InvalidSafetensors(path, f"tensor {name!r} is not described by an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEM_SIZE:
        raise InvalidSafetensors(path, f"tensor {name!r} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise InvalidSafetensors(path, f"tensor {name!r} has shape {shape!r}, not a list of whole numbers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= body):
        raise InvalidSafetensors(path, f"tensor {name!r} has data offsets {offsets!r} outside the file's "
                                       f"{body}-byte body")
    expected = math.prod(shape) * ITEM_SIZE[str(dtype)]
    if offsets[1] - offsets[0] != expected:
        raise InvalidSafetensors(path, f"tensor {name!r} is {dtype} {shape}: {expected} bytes, but its offsets "
                                       f"hold {offsets[1] - offsets[0]}")
    return TensorEntry(name, str(dtype), tuple(shape), base + offsets[0], base + offsets[1])


def _check_layout(path: Path | str, entries: list[TensorEntry], base: int, size: int) -> None:
    """Tensors share no bytes and together fill the body, as the safetensors loaders require: a gap or bytes
    after the last tensor make a file they refuse to open, whatever mreg could read of it."""
    at = base
    previous = None
    for e in sorted((e for e in entries if e.end > e.start), key=lambda e: e.start):
        if e.start < at and previous is not None:
            raise InvalidSafetensors(path, f"tensors {previous!r} and {e.name!r} overlap")
        if e.start > at:
            raise InvalidSafetensors(path, f"{e.start - at} bytes before tensor {e.name!r} belong to no tensor")
        at, previous = e.end, e.name
    if at != size:
        raise InvalidSafetensors(path, f"{size - at} bytes after the last tensor belong to no tensor")


def read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from `fd` at `offset` (pread may return less than asked); the bytes read, fewer at end of file.

    Fresh buffers, no mapping: a file changed while it is read is a short read, never a crash.
    """
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done
