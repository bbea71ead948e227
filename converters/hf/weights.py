"""NaN and Inf in safetensors weights: every floating-point tensor read in chunks, its non-finite values counted.

Chunks are read with pread(2) into fresh buffers on a few threads (pread and numpy's bitwise
ufuncs release the GIL), so memory stays flat whatever the model size. Values are judged by
their bits: an all-ones exponent is Inf or NaN in every IEEE-like format (float8 E4M3's one NaN
pattern is its all-ones exponent and mantissa), so bfloat16 and float8 need no conversion.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.convert.safetensors import read_header, read_into
from registry.errors import IntegrityError

#: safetensors float dtype -> (the unsigned integer of its width, the bits all set in Inf and NaN only, the bits
#: of the magnitude: NaN is a magnitude above Inf's bits; E4M3 and E8M0 have no Inf, their one NaN is all ones).
NONFINITE_BITS: dict[str, tuple[str, int, int]] = {
    "F64": ("<u8", 0x7FF0_0000_0000_0000, 0x7FFF_FFFF_FFFF_FFFF), "F32": ("<u4", 0x7F80_0000, 0x7FFF_FFFF),
    "F16": ("<u2", 0x7C00, 0x7FFF), "BF16": ("<u2", 0x7F80, 0x7FFF), "F8_E5M2": ("u1", 0x7C, 0x7F),
    "F8_E4M3": ("u1", 0x7F, 0x7F), "F8_E8M0": ("u1", 0xFF, 0xFF),
}
#: Bytes read per work item: a few per thread keep memory small and numpy's per-call cost negligible.
CHUNK_BYTES = 8 << 20
WORKERS = 4


class ShortRead(IntegrityError):
    """A weights file shrank while it was read."""


@dataclass(frozen=True)
class Extent:
    """Where a floating-point tensor's bytes are: the file and the absolute range [start, stop)."""

    name: str
    path: Path
    dtype: str
    start: int
    stop: int


@dataclass
class Scan:
    """What reading the weights found: tensor name -> its NaN/Inf count (only those with any), tensors read."""

    nonfinite: dict[str, int] = field(default_factory=dict)
    tensors: int = 0


def float_extents(path: Path, label: str | None = None) -> list[Extent]:
    """The floating-point tensors of a safetensors file, from its header; InvalidSafetensors (naming `label`) if
    the header does not describe the file."""
    entries = read_header(path, label)  # the registry's reader: every size checked against the file
    return [Extent(e.name, path, e.dtype, e.start, e.end) for e in entries.values() if e.dtype in NONFINITE_BITS]


def _chunks(extent: Extent) -> Iterator[tuple[Extent, int, int]]:
    """Byte ranges of whole elements of one tensor, CHUNK_BYTES at most."""
    width = np.dtype(NONFINITE_BITS[extent.dtype][0]).itemsize
    stop = extent.start + (extent.stop - extent.start) // width * width
    step = max(width, CHUNK_BYTES // width * width)
    for start in range(extent.start, stop, step):
        yield extent, start, min(stop, start + step)


def count_nonfinite(fd: int, dtype: str, start: int, stop: int, nan_only: bool = False) -> int:
    """NaN and Inf values (NaN alone with `nan_only`) among bytes [start, stop) of a file, read as `dtype`."""
    kind, bits, magnitude = NONFINITE_BITS[dtype]
    raw = np.empty((stop - start) // np.dtype(kind).itemsize, dtype=kind)
    view = raw.data.cast("B")
    if read_into(fd, view, start) < len(view):
        raise ShortRead("a weights file is shorter than its header says (was it changed while it was read?)",
                        hint="pull the model again")
    if nan_only and bits != magnitude:
        np.bitwise_and(raw, raw.dtype.type(magnitude), out=raw)
        return int(np.count_nonzero(raw > raw.dtype.type(bits)))
    mask = raw.dtype.type(bits)
    np.bitwise_and(raw, mask, out=raw)
    return int(np.count_nonzero(raw == mask))


def scan(files: Mapping[str, Path], workers: int = WORKERS) -> Scan:
    """Every floating-point tensor of the safetensors files (label -> path) read for NaN and Inf; every header is
    checked first (InvalidSafetensors names the file), before any tensor is read."""
    out = Scan()
    extents = [x for label, path in files.items() for x in float_extents(path, label)]
    out.tensors = len(extents)
    out.nonfinite = count_extents(extents, workers)
    return out


def count_extents(extents: Sequence[Extent], workers: int = WORKERS, nan_only: bool = False) -> dict[str, int]:
    """Tensor name -> its NaN/Inf (or NaN) count, only those with any; each extent read in chunks on a few threads."""
    found: dict[str, int] = {}
    fds = {p: os.open(p, os.O_RDONLY) for p in {e.path for e in extents}}
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, os.cpu_count() or 1))) as pool:
            jobs = [(e, pool.submit(count_nonfinite, fds[e.path], e.dtype, a, b, nan_only))
                    for x in extents for e, a, b in _chunks(x)]
            for e, job in jobs:
                if n := job.result():
                    found[e.name] = found.get(e.name, 0) + n
    finally:
        for fd in fds.values():
            os.close(fd)
    return found


def problems(found: Scan, limit: int = 10) -> list[str]:
    """One line per tensor with NaN or Inf values (the first `limit`, then how many more)."""
    first = list(found.nonfinite.items())[:limit]
    lines = [f"tensor {name} has {n} NaN/Inf value{'s' * (n != 1)}" for name, n in first]
    if len(found.nonfinite) > limit:
        lines.append(f"and {len(found.nonfinite) - limit} more tensors with NaN/Inf values")
    return lines
