"""The K-quants (Q2_K to Q6_K) in numpy, byte-identical to llama.cpp's reference quantizers.

Each function takes (n, 256) float32 super-blocks and returns their encoded bytes. The scale
searches (`make_qkx2_quants`, `make_q3_quants`, `make_qx_quants` in ggml-quants.c) run on all
sub-blocks at once; their per-element loops keep C's float32 order (see `converters.gguf.quants`).
Where llama.cpp leaves a sub-block's quants as the search left them (a zero scale after
rounding), so does this code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from converters.gguf.quants.blocks import (
    F32,
    Bytes,
    Floats,
    Ints,
    first_absmax,
    fp16_bits,
    fp16_round,
    nearest_int,
    safe_div,
    u16,
)

GROUP_MAX_EPS = F32(1e-15)


def _colsum(v: Floats) -> Floats:
    """Sum over axis 0 of an element-major (n, groups) array: numpy adds row after row, C's order."""
    out: Floats = np.add.reduce(v, axis=0)
    return out


def _col_absmax(x: Floats) -> tuple[Floats, Floats]:
    """Largest |x| per column and the signed value where it first occurs."""
    idx = np.abs(x).argmax(axis=0)
    signed = x[idx, np.arange(x.shape[1])]
    return np.abs(signed), signed


# The searches below work on element-major arrays (n elements x groups): every per-element step is a
# contiguous row, and every sum is a row-by-row reduction, both vectorized across groups.


def _make_qkx2(x: Floats, w: Floats, nmax: int, rmin: float, rdelta: float, nstep: int,
               use_mad: bool) -> tuple[Floats, Floats, Floats]:
    """Scale, min and quants of each row minimizing the weighted error over a grid of scales."""
    x, w = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)
    fmax = F32(nmax)
    mn = np.minimum(x.min(axis=0), F32(0))
    mx = x.max(axis=0)
    sum_w = _colsum(w)
    sum_x = _colsum(w * x)
    flat = mx == mn

    def error(scale: npt.NDArray[Any], low: npt.NDArray[Any], q: Floats) -> Floats:
        diff = scale * q + low - x
        return _colsum(w * (np.abs(diff) if use_mad else diff * diff))

    iscale = safe_div(fmax, mx - mn)
    scale = safe_div(F32(1), iscale)
    q = np.clip(nearest_int(iscale * (x - mn)), 0, nmax).astype(F32)
    best = error(scale, mn, q)
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + fmax) / (mx - mn)
        aux = np.clip(nearest_int(iscale * (x - mn)), 0, nmax).astype(F32)
        wl = w * aux
        sum_l, sum_l2, sum_xl = _colsum(wl), _colsum(wl * aux), _colsum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_min = np.where(positive, F32(0), this_min)
        this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        cur = error(this_scale, this_min, aux)
        better = (det > 0) & (cur < best) & ~flat
        q = np.where(better, aux, q)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    q[:, flat] = 0
    scale[flat] = 0
    return scale, -mn, np.ascontiguousarray(q.T)


def _make_q3(x: Floats) -> tuple[Floats, Floats]:
    """Scale and quants (0..7) of each 16-row: make_q3_quants(n, 4, x, L, do_rmse=true)."""
    x = np.ascontiguousarray(x.T)
    amax, signed = _col_absmax(x)
    zero = amax < GROUP_MAX_EPS
    iscale = F32(-4) / signed
    q = np.clip(nearest_int(iscale * x), -4, 3).astype(F32)
    w = x * x
    wx = w * x
    sumlx, suml2 = _colsum(wx * q), _colsum(w * q * q)
    active = ~zero
    for _ in range(5):
        changed = np.zeros_like(active)
        for i in range(x.shape[0]):
            qi, wi, wxi = q[i], w[i], wx[i]
            slx = sumlx - wxi * qi
            sl2 = suml2 - wi * qi * qi
            new = np.clip(nearest_int(x[i] * sl2 / slx), -4, 3).astype(F32)
            slx2 = slx + wxi * new
            sl22 = sl2 + wi * new * new
            take = active & (slx > 0) & (new != qi) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            q[i] = np.where(take, new, qi)
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    q = q + 4
    q[:, zero] = 0
    scale[zero] = 0
    return scale.astype(F32), np.ascontiguousarray(q.T)


def _make_qx(x: Floats, nmax: int) -> tuple[Floats, Floats]:
    """Scale and quants of each row: make_qx_quants(n, nmax, x, L, rmse_type=1, NULL)."""
    x = np.ascontiguousarray(x.T)
    amax, signed = _col_absmax(x)
    zero = amax < GROUP_MAX_EPS
    fmax = F32(nmax)
    w = x * x
    wx = w * x

    def attempt(iscale: Floats) -> tuple[Floats, Floats, Floats]:
        q = np.clip(nearest_int(iscale * x), -nmax, nmax - 1).astype(F32)
        return q, _colsum(wx * q), _colsum(w * q * q)

    q, sumlx, suml2 = attempt(-fmax / signed)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        cand, slx, sl2 = attempt(-(fmax + F32(0.1) * F32(step)) / signed)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        q = np.where(better, cand, q)
        scale = np.where(better, slx / sl2, scale)
        best = np.where(better, scale * slx, best)
    q = q + fmax
    q[:, zero] = 0
    scale[zero] = 0
    return scale.astype(F32), np.ascontiguousarray(q.T)


def _pack2(q: Ints) -> Bytes:
    """Four 2-bit quants per byte, in the 128-element interleave of Q2_K / Q3_K."""
    n = q.shape[0]
    h = q.reshape(n, 2, 4, 32)
    out = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    return out.reshape(n, 64).astype(np.uint8)


def _requant(x: Floats, q: Floats, d: Floats, dm: Floats, lo: int, hi: int) -> Ints:
    """Quants recomputed from the stored (rounded) scales; sub-blocks whose scale is 0 keep the search's."""
    fresh = np.clip(nearest_int((x + dm[..., None]) / d[..., None]), lo, hi).astype(F32)
    return np.where((d != 0)[..., None], fresh, q).astype(np.int32)


def q2_k(x: Floats) -> Bytes:
    """Q2_K: 16 sub-blocks of 16, 4-bit scales and mins, 2-bit quants (quantize_row_q2_K_ref)."""
    n = x.shape[0]
    g = x.reshape(-1, 16)
    scales, mins, q = _make_qkx2(g, np.abs(g), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    ls = np.where((max_scale > 0)[:, None], nearest_int(safe_div(F32(15), max_scale)[:, None] * scales), 0)
    lm = np.where((max_min > 0)[:, None], nearest_int(safe_div(F32(15), max_min)[:, None] * mins), 0)
    packed = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)
    d = np.where(max_scale > 0, max_scale / F32(15), F32(0)).astype(F32)
    dmin = np.where(max_min > 0, max_min / F32(15), F32(0)).astype(F32)
    dsub = fp16_round(d)[:, None] * (packed & 0xF).astype(F32)
    msub = fp16_round(dmin)[:, None] * (packed >> 4).astype(F32)
    quants = _requant(g.reshape(n, 16, 16), q.reshape(n, 16, 16), dsub, msub, 0, 3)
    return np.concatenate([packed, _pack2(quants.reshape(n, 256)), u16(fp16_bits(d)), u16(fp16_bits(dmin))],
                          axis=1)


def q3_k(x: Floats) -> Bytes:
    """Q3_K: 16 sub-blocks of 16, 6-bit signed scales, 3-bit quants (quantize_row_q3_K_ref)."""
    n = x.shape[0]
    g = x.reshape(-1, 16)
    scales, q = _make_q3(g)
    scales = scales.reshape(n, 16)
    _, max_scale = first_absmax(scales)
    has = max_scale != 0
    iscale = safe_div(F32(-32), max_scale)
    raw = nearest_int(iscale[:, None] * scales)
    raw = ((raw + 128) & 0xFF) - 128  # C keeps it in an int8_t before clamping
    ls = np.where(has[:, None], np.clip(raw, -32, 31) + 32, 0)
    packed = np.zeros((n, 12), dtype=np.int32)
    packed[:, :8] = (ls[:, :8] & 0xF) | ((ls[:, 8:] & 0xF) << 4)
    high = ls >> 4
    for j in range(16):
        packed[:, 8 + j % 4] |= high[:, j] << (2 * (j // 4))
    d = np.where(has, safe_div(F32(1), iscale), F32(0)).astype(F32)
    dsub = fp16_round(d)[:, None] * (ls - 32).astype(F32)
    quants = _requant(g.reshape(n, 16, 16), q.reshape(n, 16, 16) - 4, dsub, np.zeros_like(dsub), -4, 3)
    quants = (quants + 4).reshape(n, 256)
    hmask = np.bitwise_or.reduce((quants > 3).reshape(n, 8, 32).astype(np.int32) << np.arange(8)[None, :, None],
                                 axis=1)
    quants = np.where(quants > 3, quants - 4, quants)
    return np.concatenate([hmask.astype(np.uint8), _pack2(quants), packed.astype(np.uint8),
                           u16(fp16_bits(d))], axis=1)


def _kx(x: Floats, nmax: int, rmin: float, nstep: int) -> tuple[Bytes, Ints, Floats, Floats]:
    """Shared part of Q4_K and Q5_K: packed 6-bit scales and mins, quants, super-block scale and min."""
    n = x.shape[0]
    g = x.reshape(-1, 32)
    av = np.sqrt(_colsum(np.ascontiguousarray((g * g).T)) / F32(32))
    scales, mins, q = _make_qkx2(g, av[:, None] + np.abs(g), nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, safe_div(F32(63), max_scale), F32(0))
    inv_min = np.where(max_min > 0, safe_div(F32(63), max_min), F32(0))
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
    packed = np.zeros((n, 12), dtype=np.int32)
    packed[:, :4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    d = (max_scale / F32(63)).astype(F32)
    dmin = (max_min / F32(63)).astype(F32)
    dsub = fp16_round(d)[:, None] * ls.astype(F32)
    msub = fp16_round(dmin)[:, None] * lm.astype(F32)
    quants = _requant(g.reshape(n, 8, 32), q.reshape(n, 8, 32), dsub, msub, 0, nmax)
    head = np.concatenate([u16(fp16_bits(d)), u16(fp16_bits(dmin)), packed.astype(np.uint8)], axis=1)
    return head, quants.reshape(n, 4, 2, 32), d, dmin


def q4_k(x: Floats) -> Bytes:
    """Q4_K: 8 sub-blocks of 32, 6-bit scales and mins, 4-bit quants (quantize_row_q4_K_ref)."""
    head, q, _, _ = _kx(x, 15, -1.0, 20)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(x.shape[0], 128)
    return np.concatenate([head, qs.astype(np.uint8)], axis=1)


def q5_k(x: Floats) -> Bytes:
    """Q5_K: 8 sub-blocks of 32, 6-bit scales and mins, 5-bit quants (quantize_row_q5_K_ref)."""
    head, q, _, _ = _kx(x, 31, -0.5, 15)
    n = x.shape[0]
    shifts = (2 * np.arange(4))[None, :, None]
    qh = np.bitwise_or.reduce((((q[:, :, 0] >> 4) & 1) << shifts) | (((q[:, :, 1] >> 4) & 1) << (shifts + 1)), axis=1)
    qs = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(n, 128)
    return np.concatenate([head, qh.astype(np.uint8), qs.astype(np.uint8)], axis=1)


def q6_k(x: Floats) -> Bytes:
    """Q6_K: 16 sub-blocks of 16, 8-bit scales, 6-bit quants (quantize_row_q6_K_ref)."""
    n = x.shape[0]
    g = x.reshape(-1, 16)
    scales, q = _make_qx(g, 32)
    scales = scales.reshape(n, 16)
    max_abs, max_scale = first_absmax(scales)
    empty = max_abs < GROUP_MAX_EPS
    iscale = safe_div(F32(-128), max_scale)
    ls = np.minimum(127, nearest_int(iscale[:, None] * scales))
    ls = ((ls + 128) & 0xFF) - 128  # stored in an int8_t
    d = safe_div(F32(1), iscale)
    dsub = fp16_round(d)[:, None] * ls.astype(F32)
    quants = _requant(g.reshape(n, 16, 16), q.reshape(n, 16, 16) - 32, dsub, np.zeros_like(dsub), -32, 31)
    quants = (quants + 32).reshape(n, 2, 4, 32)
    ql = np.concatenate([(quants[:, :, 0] & 0xF) | ((quants[:, :, 2] & 0xF) << 4),
                         (quants[:, :, 1] & 0xF) | ((quants[:, :, 3] & 0xF) << 4)], axis=2)
    qh = sum((quants[:, :, k] >> 4) << (2 * k) for k in range(4))
    out = np.concatenate([ql.reshape(n, 128).astype(np.uint8), np.asarray(qh).reshape(n, 64).astype(np.uint8),
                          ls.astype(np.int8).view(np.uint8), u16(fp16_bits(d))], axis=1)
    out[empty] = 0
    return out
