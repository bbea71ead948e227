"""GGML tensor encodings in numpy, byte-identical to llama.cpp's reference quantizers (no importance matrix).

Every function takes float32 rows and returns their encoded bytes, one row of blocks per input row.
llama.cpp computes in IEEE single precision, element by element; to give the same bytes, every
sum here is a sequential float32 accumulation (a row-by-row reduction over axis 0, never numpy's
pairwise summation along a contiguous axis), every expression keeps C's evaluation order, and
rounding to an integer reproduces ggml's `nearest_int` bit trick. The K-quant searches are
vectorized across blocks, never across the elements of one block. The 32-block types live here;
the 256-element super-block K-quants in `converters.gguf_kquants`.

numpy runs the K-quant searches several times slower than C. When llama-cpp-python is
installed, `quantize` therefore calls llama.cpp's own `ggml_quantize_chunk` for the block types
(the tests hold both implementations to the same bytes); `MREG_GGUF_QUANTIZER=numpy` forces numpy.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = np.float32
Floats = npt.NDArray[np.float32]
Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int32]

QK = 32
QK_K = 256

#: (elements per block, bytes per block) of every type this module writes.
BLOCK: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}


def row_bytes(qtype: str, ncols: int) -> int:
    """Bytes of one encoded row of `ncols` elements."""
    block, size = BLOCK[qtype]
    return ncols // block * size


def nearest_int(v: npt.NDArray[Any]) -> Ints:
    """ggml's nearest_int: add 1.5 * 2**23 in float32 and read the mantissa (ties to even, garbage past 2**22)."""
    bits = (v.astype(F32) + F32(12582912.0)).view(np.int32)
    out: Ints = (bits & 0x007FFFFF) - 0x00400000
    return out


def first_absmax(x: Floats) -> tuple[Floats, Floats]:
    """Largest |x| per row, and the signed value where it first occurs (C's strict `>` scan)."""
    idx = np.abs(x).argmax(axis=-1)
    signed = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
    return np.abs(signed), signed


def fp16_bits(v: Floats) -> npt.NDArray[np.uint16]:
    """IEEE half bits, round to nearest even like GGML_FP32_TO_FP16."""
    out: npt.NDArray[np.uint16] = v.astype(np.float16).view(np.uint16)
    return out


def fp16_round(v: Floats) -> Floats:
    """The float32 value of a number after a trip through half precision."""
    out: Floats = v.astype(np.float16).astype(F32)
    return out


def safe_div(num: Floats | np.float32, den: Floats) -> Floats:
    """num / den where den != 0, else 0 (C's `d ? 1/d : 0`)."""
    out = np.zeros(np.broadcast(num, den).shape, dtype=F32)
    np.divide(num, den, out=out, where=den != 0)
    return out


def _roundf(v: Floats) -> Floats:
    """C roundf: halves away from zero (x - trunc(x) is exact, so the test is too)."""
    t = np.trunc(v)
    out: Floats = t + np.where(np.abs(v - t) >= F32(0.5), np.sign(v), F32(0)).astype(F32)
    return out


def _trunc_int(v: Floats) -> Ints:
    """C's float-to-integer conversion (toward zero), for values known to be small."""
    out: Ints = np.trunc(np.clip(np.nan_to_num(v), -(2.0**30), 2.0**30)).astype(np.int32)
    return out


def _u16(v: npt.NDArray[np.uint16]) -> Bytes:
    """Little-endian bytes of each uint16, as a (n, 2) array."""
    return v.astype("<u2").view(np.uint8).reshape(-1, 2)


def _nibbles(lo: Ints, hi: Ints) -> Bytes:
    """Pack two 4-bit values per byte."""
    return ((lo & 0xF) | ((hi & 0xF) << 4)).astype(np.uint8)


def _high_bits(q: Ints) -> Bytes:
    """The 5th bit of each of 32 quants as a little-endian uint32 (bit j for quant j)."""
    bits = ((q >> 4) & 1).astype(np.uint32) << np.arange(QK, dtype=np.uint32)
    out: Bytes = np.bitwise_or.reduce(bits, axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)
    return out


def q8_0(x: Floats) -> Bytes:
    """Q8_0: a half scale and 32 signed bytes (quantize_row_q8_0_ref)."""
    amax = np.abs(x).max(axis=1)
    d = amax / F32(127)
    q = _roundf(x * safe_div(F32(1), d)[:, None]).astype(np.int8)
    return np.concatenate([_u16(fp16_bits(d)), q.view(np.uint8)], axis=1)


def _sym(x: Floats, levels: int) -> tuple[Floats, Ints]:
    """Scale from the signed extreme (max / -levels) and quants offset by levels + 0.5 (Q4_0, Q5_0)."""
    _, signed = first_absmax(x)
    d = signed / F32(-levels)
    q = _trunc_int(x * safe_div(F32(1), d)[:, None] + F32(levels + 0.5))
    return d, np.minimum(2 * levels - 1, q)


def _asym(x: Floats, levels: int) -> tuple[Floats, Floats, Ints]:
    """Scale and min from the range (Q4_1, Q5_1)."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / F32(levels)
    q = _trunc_int((x - lo[:, None]) * safe_div(F32(1), d)[:, None] + F32(0.5))
    return d, lo, q


def q4_0(x: Floats) -> Bytes:
    """Q4_0: half scale, 16 bytes of nibbles (quantize_row_q4_0_ref)."""
    d, q = _sym(x, 8)
    return np.concatenate([_u16(fp16_bits(d)), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q4_1(x: Floats) -> Bytes:
    """Q4_1: half scale and min, 16 bytes of nibbles (quantize_row_q4_1_ref)."""
    d, lo, q = _asym(x, 15)
    q = np.minimum(15, q)
    return np.concatenate([_u16(fp16_bits(d)), _u16(fp16_bits(lo)), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q5_0(x: Floats) -> Bytes:
    """Q5_0: half scale, 32 high bits, 16 bytes of nibbles (quantize_row_q5_0_ref)."""
    d, q = _sym(x, 16)
    return np.concatenate([_u16(fp16_bits(d)), _high_bits(q), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q5_1(x: Floats) -> Bytes:
    """Q5_1: half scale and min, 32 high bits, 16 bytes of nibbles (quantize_row_q5_1_ref, no clamp)."""
    d, lo, q = _asym(x, 31)
    q = q & 0xFF  # C stores it in a uint8_t
    return np.concatenate(
        [_u16(fp16_bits(d)), _u16(fp16_bits(lo)), _high_bits(q), _nibbles(q[:, :16], q[:, 16:])], axis=1
    )


def f16(x: Floats) -> Bytes:
    """IEEE half precision, round to nearest even."""
    return fp16_bits(x).view(np.uint8).reshape(-1, 2)


def bf16(x: Floats) -> Bytes:
    """bfloat16, round to nearest even, NaN kept quiet (ggml_compute_fp32_to_bf16)."""
    u = x.astype(F32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    out = np.where(nan, (u >> 16) | np.uint32(64), rounded).astype("<u2")
    return out.view(np.uint8).reshape(-1, 2)


def f32(x: Floats) -> Bytes:
    """float32 as is."""
    return x.astype("<f4").view(np.uint8).reshape(-1, 4)


def encoder(qtype: str) -> Callable[[Floats], Bytes]:
    """The block encoder of a type: it takes (nblocks, block) float32 and returns (nblocks, bytes)."""
    from converters.gguf_kquants import q2_k, q3_k, q4_k, q5_k, q6_k

    table: dict[str, Callable[[Floats], Bytes]] = {
        "F32": f32, "F16": f16, "BF16": bf16, "Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0,
        "Q5_1": q5_1, "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k,
    }
    return table[qtype]


def _llama_cpp_lib(name: str) -> ctypes.CDLL | None:
    """One of the ggml libraries an installed llama-cpp-python ships, or None."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "lib" / name
    return ctypes.CDLL(str(path)) if path.is_file() else None


@functools.cache
def _ggml_quantize_chunk() -> Callable[..., int] | None:
    """llama.cpp's ggml_quantize_chunk from an installed llama-cpp-python, unless MREG_GGUF_QUANTIZER=numpy."""
    lib = None if os.environ.get("MREG_GGUF_QUANTIZER", "auto") == "numpy" else _llama_cpp_lib("libggml-base.so")
    if lib is None:
        return None
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    return fn


@functools.cache
def _ggml_cpu_converter(qtype: str) -> Callable[..., None] | None:
    """ggml-cpu's vectorized float32 -> F16/BF16 row converter (same bytes as numpy's rounding), or None."""
    lib = _llama_cpp_lib("libggml-cpu.so")
    if lib is None:
        return None
    fn = getattr(lib, {"F16": "ggml_cpu_fp32_to_fp16", "BF16": "ggml_cpu_fp32_to_bf16"}[qtype])
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn  # type: ignore[no-any-return]


def backend(qtype: str) -> str:
    """Which implementation encodes `qtype` here: "numpy", or "ggml" (the same bytes, from C, in parallel)."""
    # F16 and BF16 too: ggml-cpu's converters use the CPU's conversion instructions (0.09 ns per value
    # against 2.5 for numpy's F16 and 6.6 for its BF16, measured here), with the same rounding; F32 is a copy.
    return "ggml" if qtype != "F32" and _ggml_quantize_chunk() is not None else "numpy"


def quantize(rows: Floats, qtype: str, use: str | None = None) -> Bytes:
    """Encode float32 rows (nrows, ncols) as `qtype`; ncols must be a multiple of the block size."""
    block, size = BLOCK[qtype]
    nrows, ncols = rows.shape
    if ncols % block:
        raise ValueError(f"{qtype} needs rows of a multiple of {block} elements, got {ncols}")
    rows = np.ascontiguousarray(rows, dtype=F32)
    engine = use or backend(qtype)
    if engine == "ggml" and qtype in ("F16", "BF16") and (convert := _ggml_cpu_converter(qtype)):
        halves = np.empty((nrows, ncols), dtype=np.uint16)
        convert(rows.ctypes.data, halves.ctypes.data, rows.size)  # ctypes releases the GIL here too
        return halves.view(np.uint8)
    if engine == "ggml":
        fn = _ggml_quantize_chunk()
        assert fn is not None
        out = np.empty((nrows, ncols // block * size), dtype=np.uint8)
        from converters.gguf_file import GGML_TYPES

        # ctypes releases the GIL for the call: the encoding threads really run in parallel.
        fn(GGML_TYPES[qtype], rows.ctypes.data, out.ctypes.data, 0, nrows, ncols, None)
        return out
    with np.errstate(all="ignore"):
        encoded = encoder(qtype)(rows.reshape(-1, block))
    return encoded.reshape(nrows, ncols // block * size)
