"""The 32-element block encodings (Q8_0, Q4_0, …), F16/BF16, and the arithmetic every GGML encoder shares.

Byte-identical to llama.cpp's reference quantizers: sequential float32 accumulation, C's
evaluation order, ggml's `nearest_int` rounding (see the package's docstring).
"""

from __future__ import annotations

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
    # The IQ types (llama.cpp encodes them; mreg has no numpy encoder of its own for these).
    "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ2_S": (256, 82),
    "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}


#: Byte offsets, in a block, of the half-precision fields (scale, min) it decodes through. Its other fields
#: are small integers, so a block decodes to NaN or Inf exactly when one of these is not finite.
HALF_FIELDS: dict[str, tuple[int, ...]] = {
    "F16": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ1_S": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
#: IQ1_M has no half field: its block scale is a half spread over the top nibbles of its four u16 scales (at 48).
_IQ1_M_SCALES = 48


def nonfinite(data: Bytes, qtype: str) -> int:
    """Values of encoded rows that decode to NaN or Inf (every value of a block whose scale or min is)."""
    block, size = BLOCK[qtype]
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(-1, size)
    if qtype == "F32":
        return int(np.count_nonzero(~np.isfinite(blocks.view("<f4"))))
    exponent, fields = (0x7F80, (0,)) if qtype == "BF16" else (0x7C00, HALF_FIELDS.get(qtype, ()))
    bad = np.zeros(len(blocks), dtype=bool)
    if qtype == "IQ1_M":
        sc = np.ascontiguousarray(blocks[:, _IQ1_M_SCALES:_IQ1_M_SCALES + 8]).view("<u2")
        half = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        bad |= (half & exponent) == exponent
    for at in fields:
        half = np.ascontiguousarray(blocks[:, at:at + 2]).view("<u2")[:, 0]
        bad |= (half & exponent) == exponent
    return int(np.count_nonzero(bad)) * block


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


def u16(v: npt.NDArray[np.uint16]) -> Bytes:
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
    return np.concatenate([u16(fp16_bits(d)), q.view(np.uint8)], axis=1)


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
    return np.concatenate([u16(fp16_bits(d)), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q4_1(x: Floats) -> Bytes:
    """Q4_1: half scale and min, 16 bytes of nibbles (quantize_row_q4_1_ref)."""
    d, lo, q = _asym(x, 15)
    q = np.minimum(15, q)
    return np.concatenate([u16(fp16_bits(d)), u16(fp16_bits(lo)), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q5_0(x: Floats) -> Bytes:
    """Q5_0: half scale, 32 high bits, 16 bytes of nibbles (quantize_row_q5_0_ref)."""
    d, q = _sym(x, 16)
    return np.concatenate([u16(fp16_bits(d)), _high_bits(q), _nibbles(q[:, :16], q[:, 16:])], axis=1)


def q5_1(x: Floats) -> Bytes:
    """Q5_1: half scale and min, 32 high bits, 16 bytes of nibbles (quantize_row_q5_1_ref, no clamp)."""
    d, lo, q = _asym(x, 31)
    q = q & 0xFF  # C stores it in a uint8_t
    return np.concatenate(
        [u16(fp16_bits(d)), u16(fp16_bits(lo)), _high_bits(q), _nibbles(q[:, :16], q[:, 16:])], axis=1
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


