"""safetensors headers, read as hostile input: every size is checked against the file before anything is allocated.

A file is 8 bytes of little-endian header length, a JSON header, then the tensors' bytes. The
header must be a JSON object whose entries each give a known dtype, a shape of whole numbers
and data offsets inside the body that match the shape's size, do not overlap and leave no byte
unaccounted for (what the safetensors loaders accept); anything else is `InvalidSafetensors`
(exit 4), naming the file and the tensor, before a converter reads a row.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import IntegrityError

#: Bits per element of every dtype the safetensors format defines (as its loaders know them: F4 and F6 pack
#: several elements to a byte; a tensor of them must still fill whole bytes).
ITEM_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
             "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
             "I64": 64, "U64": 64, "F64": 64}
#: The format's own limit on the header (100 MB): a larger length is damage, not a model.
MAX_HEADER = 100_000_000
#: Sizes and offsets are 64-bit unsigned integers in the loaders: a larger one, or a shape whose element or
#: byte count passes it, is refused by them, so by mreg too.
USIZE_MAX = (1 << 64) - 1
#: serde_json's nesting limit (its recursion limit of 128): a header nested deeper is one the loaders cannot parse.
MAX_DEPTH = 127


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
    header = _parse(name, raw)
    metadata = header.pop("__metadata__", None)
    # The loaders read it as a map of strings to strings (or nothing): any other value makes them refuse the file.
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise InvalidSafetensors(name, "__metadata__ is not a map of strings to strings")
    body = size - 8 - length
    entries = [_entry(name, key, info, 8 + length, body) for key, info in header.items()]
    _check_layout(name, entries, 8 + length, size)
    return {e.name: e for e in entries}


def _parse(name: Path | str, raw: bytes) -> dict[str, Any]:
    """The header as a JSON object, read as the loaders' parser (serde_json) reads it: UTF-8 only, no NaN or
    Infinity, no string that is not valid Unicode; a tensor or metadata key given twice is the last one given, as
    there, but `__metadata__` or a tensor's dtype, shape or offsets given twice are refused, as there."""
    def constant(text: str) -> Any:
        raise ValueError(f"{text} is not JSON")

    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=constant, object_pairs_hook=_Object)
        if isinstance(header, dict):
            json.dumps(header, ensure_ascii=False).encode("utf-8")  # a lone surrogate escape (\ud800) fails here
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise InvalidSafetensors(name, f"the header is not JSON ({str(e) or type(e).__name__})") from None
    if not isinstance(header, _Object):
        raise InvalidSafetensors(name, "the header is not a JSON object")
    if _depth(header) > MAX_DEPTH:
        raise InvalidSafetensors(name, f"the header nests deeper than {MAX_DEPTH} levels")
    twice = ["__metadata__"] if "__metadata__" in header.twice else []
    twice += [f"{key!r}'s {field}" for key, info in header.items()
              if key != "__metadata__" and isinstance(info, _Object)
              for field in sorted(info.twice & {"dtype", "shape", "data_offsets"})]
    if twice:
        raise InvalidSafetensors(name, f"the header gives {twice[0]} twice")
    return dict(header)


class _Object(dict[str, Any]):
    """A JSON object as parsed (the last of a key given twice), remembering which keys were given twice."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.twice: set[str] = set()
        if len(self) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    self.twice.add(key)
                seen.add(key)


def _depth(value: object) -> int:
    """How deep arrays and objects nest in a parsed JSON value (1 for a flat object)."""
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [v for x in level if isinstance(x, dict | list) for v in (x.values() if isinstance(x, dict) else x)
                 if isinstance(v, dict | list)]
    return depth


def _entry(path: Path | str, name: str, info: object, base: int, body: int) -> TensorEntry:
    """One header entry, or the reason it is not one."""
    if not isinstance(info, dict):
        raise InvalidSafetensors(path, f"tensor {name!r} is not described by an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEM_BITS:
        raise InvalidSafetensors(path, f"tensor {name!r} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_usize(d) for d in shape):
        raise InvalidSafetensors(path, f"tensor {name!r} has shape {shape!r}, not a list of whole numbers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_usize(o) for o in offsets)
            or not offsets[0] <= offsets[1] <= body):
        raise InvalidSafetensors(path, f"tensor {name!r} has data offsets {offsets!r} outside the file's "
                                       f"{body}-byte body")
    # The element count as the loaders compute it: dimension by dimension in 64 bits, an overflow refused even
    # when a later dimension is 0 (math.prod would say 0 bytes and accept a file they reject).
    count = 1
    for d in shape:
        count *= d
        if count > USIZE_MAX:
            raise InvalidSafetensors(path, f"tensor {name!r} has shape {shape!r}, whose size overflows")
    bits = count * ITEM_BITS[str(dtype)]
    if bits > USIZE_MAX:
        raise InvalidSafetensors(path, f"tensor {name!r} has shape {shape!r}, whose size overflows")
    if bits % 8:
        raise InvalidSafetensors(path, f"tensor {name!r} is {dtype} {shape}: {bits} bits, not whole bytes")
    expected = bits // 8
    if offsets[1] - offsets[0] != expected:
        raise InvalidSafetensors(path, f"tensor {name!r} is {dtype} {shape}: {expected} bytes, but its offsets "
                                       f"hold {offsets[1] - offsets[0]}")
    return TensorEntry(name, str(dtype), tuple(shape), base + offsets[0], base + offsets[1])


def _is_usize(value: object) -> bool:
    """A whole number the loaders read as a 64-bit unsigned size."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= USIZE_MAX


def _check_layout(path: Path | str, entries: list[TensorEntry], base: int, size: int) -> None:
    """Tensors in the order of their offsets follow one another with no gap and no overlap, and the last ends the
    file, as the safetensors loaders require (an empty tensor too must sit where the one before it ends): a gap,
    an overlap or bytes after the last tensor make a file they refuse to open, whatever mreg could read of it."""
    at = base
    previous = None
    for e in sorted(entries, key=lambda e: (e.start, e.end)):
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
