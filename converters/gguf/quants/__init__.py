"""GGML tensor encodings in numpy, byte-identical to llama.cpp's reference quantizers (no importance matrix).

Every function takes float32 rows and returns their encoded bytes, one row of blocks per input row.
llama.cpp computes in IEEE single precision, element by element; to give the same bytes, every
sum here is a sequential float32 accumulation (a row-by-row reduction over axis 0, never numpy's
pairwise summation along a contiguous axis), every expression keeps C's evaluation order, and
rounding to an integer reproduces ggml's `nearest_int` bit trick. The K-quant searches are
vectorized across blocks, never across the elements of one block. The 32-block types live here;
the 256-element super-block K-quants in `converters.gguf.quants.kquants`.

numpy runs the K-quant searches several times slower than C. When llama-cpp-python is
installed, `quantize` therefore calls llama.cpp's own `ggml_quantize_chunk` for the block types
(the tests hold both implementations to the same bytes). Q8_0 and the K-quants (Q2_K to Q6_K) have a third
implementation, mreg's own vectorized kernels (`_native.c`, built with the package where a C compiler
is present): the same bytes as llama.cpp's reference encoders, several times faster (`NATIVE_TYPES`).
`MREG_GGUF_QUANTIZER=numpy` forces numpy; `MREG_GGUF_QUANTIZER=ggml` forces llama.cpp's encoder (mreg's
kernels off).

With an importance matrix (a weight per input column, llama.cpp's `quant_weights`) mreg's kernels
encode the K-quants, handing blocks they cannot prove to llama.cpp's encoder; the other types,
and the IQ types (whose lattice searches mreg does not reimplement), are llama.cpp's alone. Weighted
work therefore takes llama.cpp's encoder: `needs_ggml` says so, and the converter refuses such work,
naming llama-cpp-python, where it is absent.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.gguf.file import GGML_TYPES
from converters.gguf.quants.blocks import (
    BLOCK,
    F32,
    Bytes,
    Floats,
    bf16,
    f16,
    f32,
    nonfinite,
    q4_0,
    q4_1,
    q5_0,
    q5_1,
    q8_0,
    row_bytes,
)
from converters.gguf.quants.kquants import q2_k, q3_k, q4_k, q5_k, q6_k
from registry.config import MREG_GGUF_QUANTIZER
from registry.errors import UsageError

__all__ = ["BLOCK", "NATIVE_TYPES", "NUMPY_TYPES", "Bytes", "Floats", "backend", "encoder", "ggml_available",
           "native_available", "needs_ggml", "nonfinite", "quantize", "row_bytes", "widen_bf16"]

#: The types mreg's numpy encoders write (the IQ types are llama.cpp's alone).
NUMPY_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
#: The types mreg's own kernels (`_native.c`) encode without an importance matrix, and each one's entry point.
_KERNELS = {"Q8_0": "mreg_quantize_q8_0", "Q6_K": "mreg_quantize_q6_k", "Q5_K": "mreg_quantize_q5_k",
            "Q4_K": "mreg_quantize_q4_k", "Q3_K": "mreg_quantize_q3_k", "Q2_K": "mreg_quantize_q2_k"}
#: Those they encode with one (llama.cpp's quantize_row_*_impl).
_WEIGHTED_KERNELS = {"Q6_K": "mreg_quantize_q6_k_w", "Q5_K": "mreg_quantize_q5_k_w", "Q4_K": "mreg_quantize_q4_k_w",
                     "Q3_K": "mreg_quantize_q3_k_w", "Q2_K": "mreg_quantize_q2_k_w"}
NATIVE_TYPES = tuple(_KERNELS)
#: Blocks handed back one at a time before the rest of a call's rows go to llama.cpp's encoder whole (a tensor of
#: NaN would otherwise cost two calls a block).
_HANDBACKS = 64
#: Types ggml_quantize_chunk aborts on (GGML_ASSERT) without an importance matrix.
_GGML_NEEDS_IMATRIX = ("IQ2_XXS", "IQ2_XS", "IQ1_S")
#: Types whose encoders ignore importance weights (floats; Q8_0's quantize_q8_0 takes none).
_UNWEIGHTED = ("F32", "F16", "BF16", "Q8_0")


def encoder(qtype: str) -> Callable[[Floats], Bytes]:
    """The block encoder of a type: it takes (nblocks, block) float32 and returns (nblocks, bytes)."""
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
def _native_kernel() -> ctypes.CDLL | None:
    """mreg's kernels (`_native.c`), where the package was installed with them built, or None."""
    spec = importlib.util.find_spec(f"{__name__}._native")
    if spec is None or spec.origin is None:
        return None
    return load_kernels(spec.origin)


def load_kernels(path: str) -> ctypes.CDLL:
    """A build of `_native.c` with its entry points' signatures declared (the installed one, or one the tests and
    benchmarks build for a single target)."""
    lib = ctypes.CDLL(path)
    for name in _KERNELS.values():
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    for name in _WEIGHTED_KERNELS.values():  # and the importance weights, a row's blocks, the first block's column
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                       ctypes.c_int64, ctypes.c_int64]
    lib.mreg_vector_bytes.restype = ctypes.c_int
    lib.mreg_vector_bytes.argtypes = []
    lib.mreg_half_bits.restype = None
    lib.mreg_half_bits.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


QUANTIZER_ENV = MREG_GGUF_QUANTIZER.name
#: Its values: unset or auto (the fastest encoder here), numpy, ggml.
QUANTIZERS = ("auto", "numpy", "ggml")


def _forced() -> str:
    """MREG_GGUF_QUANTIZER: "numpy" (mreg's numpy encoders only), "ggml" (llama.cpp's, mreg's kernel off), or auto;
    any other value is a usage error (a typo must not silently pick the default)."""
    value = MREG_GGUF_QUANTIZER.value() or "auto"
    if value not in QUANTIZERS:
        raise UsageError(f"{QUANTIZER_ENV}={value[:40]!r} is not one of {', '.join(QUANTIZERS)}",
                         hint=f"set {QUANTIZER_ENV} to numpy or ggml, or unset it (auto)")
    return value


def check_settings() -> None:
    """Refuse a bad MREG_GGUF_QUANTIZER before any work (it is otherwise read only when a tensor is encoded)."""
    _forced()


def native_available() -> bool:
    """Whether mreg's own kernels are built here (and not turned off by MREG_GGUF_QUANTIZER)."""
    return _forced() not in ("numpy", "ggml") and _native_kernel() is not None


def _native_pays(qtype: str) -> bool:
    """Whether mreg's kernel for `qtype` is the fastest encoder here: Q8_0's everywhere; the K-quants' (16 vector
    lanes of 4 bytes) with 32-byte vectors or wider (AVX2, AVX-512), and in their SSE clone only where llama.cpp's
    encoder (faster than it) is not installed (numpy's is slower)."""
    lib = _native_kernel()
    return lib is not None and (qtype == "Q8_0" or int(lib.mreg_vector_bytes()) >= 32
                                or _ggml_quantize_chunk() is None)


def _quantize_native(lib: ctypes.CDLL, rows: Floats, qtype: str, importance: Floats | None) -> Bytes:
    """`qtype` by mreg's kernel; each block it hands back (NaN, Inf, a scale it cannot prove) by llama.cpp's
    encoder where it is installed, else numpy's (both byte-identical to it there), and the kernel goes on after it.
    The blocks are independent (with an importance matrix, given their columns' weights), so rows are one long row
    here. Weights holding NaN or Inf go to llama.cpp's encoder whole."""
    block, size = BLOCK[qtype]
    nblocks, row_blocks = rows.size // block, rows.shape[1] // block
    weights = None if importance is None else np.ascontiguousarray(importance, dtype=F32)
    if weights is not None and not np.isfinite(weights).all():  # in float32 (1e39 is Inf there)
        return quantize(rows, qtype, use="ggml", importance=weights)
    flat = rows.reshape(-1)
    out = np.empty((rows.shape[0], row_blocks * size), dtype=np.uint8)
    blocks = out.reshape(-1, size)

    def kernel(at: int) -> int:  # ctypes releases the GIL for the call
        x, y = flat.ctypes.data + 4 * block * at, blocks.ctypes.data + size * at
        if weights is None:
            return int(getattr(lib, _KERNELS[qtype])(x, y, nblocks - at))
        return int(getattr(lib, _WEIGHTED_KERNELS[qtype])(x, y, nblocks - at, weights.ctypes.data, row_blocks,
                                                          at % row_blocks))

    at = handed = 0
    while at < nblocks and (stop := kernel(at)) >= 0:
        stop += at
        handed += 1
        end = nblocks if handed >= _HANDBACKS else stop + 1
        blocks[stop:end] = _by_llama_cpp(flat, stop, end, qtype, weights, row_blocks).reshape(-1, size)
        at = end
    return out


def _by_llama_cpp(flat: Floats, start: int, end: int, qtype: str, importance: Floats | None,
                  row_blocks: int) -> Bytes:
    """Blocks [start, end) of flattened rows by llama.cpp's encoder (numpy's where it is absent and no weights are
    given): one long row, or with weights each row's part with its own columns' weights."""
    block = BLOCK[qtype][0]
    if importance is None:
        rest = flat[start * block:end * block].reshape(1, -1)
        return quantize(rest, qtype, use="ggml" if ggml_available() else "numpy")
    parts = []
    while start < end:
        col = start % row_blocks
        stop = min(end, start - col + row_blocks)
        part = flat[start * block:stop * block].reshape(1, -1)
        parts.append(quantize(part, qtype, use="ggml", importance=importance[col * block:(col + stop - start) * block]))
        start = stop
    return np.concatenate(parts, axis=1)


@functools.cache
def _ggml_quantize_chunk() -> Callable[..., int] | None:
    """llama.cpp's ggml_quantize_chunk from an installed llama-cpp-python, unless MREG_GGUF_QUANTIZER=numpy."""
    lib = None if _forced() == "numpy" else _llama_cpp_lib("libggml-base.so")
    if lib is None:
        return None
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    return fn


@functools.cache
def _ggml_cpu_converter(name: str) -> Callable[..., None] | None:
    """One of ggml-cpu's vectorized row converters `(src, dst, n)`, or None: `ggml_cpu_fp32_to_fp16` and
    `ggml_cpu_fp32_to_bf16` (same bytes as numpy's rounding), `ggml_cpu_bf16_to_fp32` (a shift, exact)."""
    lib = _llama_cpp_lib("libggml-cpu.so")
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn  # type: ignore[no-any-return]


#: The ggml-cpu converter from float32 to each half-width type.
_FROM_F32 = {"F16": "ggml_cpu_fp32_to_fp16", "BF16": "ggml_cpu_fp32_to_bf16"}


def widen_bf16(raw: np.ndarray[Any, Any], out: Floats) -> bool:
    """bfloat16 values (as uint16, contiguous) into float32 `out` with ggml-cpu's widening; False where it is absent.

    One vectorized pass (0.10 ns a value here) where numpy's shift into the wide type casts, then shifts
    (0.25 ns in isolation; `perf` put the two loops at 7% of a 1.1 B Q8_0 conversion's CPU, writer and
    reference pass together). ctypes releases the GIL for the call.
    """
    fn = _ggml_cpu_converter("ggml_cpu_bf16_to_fp32")
    if fn is None or not (raw.flags.c_contiguous and out.flags.c_contiguous) or raw.size != out.size:
        return False
    fn(raw.ctypes.data, out.ctypes.data, raw.size)
    return True


def ggml_available() -> bool:
    """Whether llama.cpp's encoder is here (and not turned off by MREG_GGUF_QUANTIZER=numpy)."""
    return _ggml_quantize_chunk() is not None


def needs_ggml(qtype: str, weighted: bool) -> bool:
    """Whether encoding `qtype` (with importance weights or not) takes llama.cpp's encoder."""
    return (weighted and qtype not in _UNWEIGHTED) or qtype not in NUMPY_TYPES


def backend(qtype: str, weighted: bool = False) -> str:
    """Which implementation encodes `qtype` (with importance weights or not) here: "numpy", "ggml" (the same
    bytes, from llama.cpp's C, in parallel), or "native" (mreg's own vectorized kernels, the same bytes again:
    `NATIVE_TYPES`, and the K-quants with weights)."""
    weighted = weighted and qtype not in _UNWEIGHTED
    if native_available() and qtype in (_WEIGHTED_KERNELS if weighted else _KERNELS) and _native_pays(qtype):
        return "native"
    if weighted and needs_ggml(qtype, weighted):
        return "ggml"
    # F16 and BF16 too: ggml-cpu's converters use the CPU's conversion instructions (0.09 ns per value
    # against 2.5 for numpy's F16 and 6.6 for its BF16, measured here), with the same rounding; F32 is a copy.
    return "ggml" if qtype != "F32" and _ggml_quantize_chunk() is not None else "numpy"


def quantize(rows: Floats, qtype: str, use: str | None = None, importance: Floats | None = None) -> Bytes:
    """Encode float32 rows (nrows, ncols) as `qtype`; ncols must be a multiple of the block size.

    `importance`: one weight per column (an importance matrix's mean squared activation, as
    llama.cpp's quantizer hands it to ggml_quantize_chunk); llama.cpp's encoder, or mreg's kernels for
    the K-quants.
    """
    block, size = BLOCK[qtype]
    nrows, ncols = rows.shape
    if ncols % block:
        raise ValueError(f"{qtype} needs rows of a multiple of {block} elements, got {ncols}")
    rows = np.ascontiguousarray(rows, dtype=F32)
    if importance is not None and qtype in _UNWEIGHTED:
        importance = None  # llama.cpp reads no weights for these
    engine = use or backend(qtype, importance is not None)
    if needs_ggml(qtype, importance is not None) and engine not in ("ggml", "native"):
        raise ValueError(f"{qtype}{' with an importance matrix' if importance is not None else ''} is encoded by "
                         "llama.cpp only (install llama-cpp-python)")
    if importance is None and qtype in _GGML_NEEDS_IMATRIX:
        raise ValueError(f"{qtype} needs an importance matrix (llama.cpp aborts without one)")
    if engine == "native":
        if qtype not in (_KERNELS if importance is None else _WEIGHTED_KERNELS) or (lib := _native_kernel()) is None:
            raise ValueError(f"mreg's native kernels encode {', '.join(NATIVE_TYPES)} (and with an importance matrix "
                             f"{', '.join(_WEIGHTED_KERNELS)}), where they are built (asked for {qtype})")
        if importance is not None and np.shape(importance) != (ncols,):
            raise ValueError(f"importance of shape {np.shape(importance)} for rows of {ncols} columns")
        return _quantize_native(lib, rows, qtype, importance)
    if engine == "ggml" and qtype in _FROM_F32 and (convert := _ggml_cpu_converter(_FROM_F32[qtype])):
        halves = np.empty((nrows, ncols), dtype=np.uint16)
        convert(rows.ctypes.data, halves.ctypes.data, rows.size)  # ctypes releases the GIL here too
        return halves.view(np.uint8)
    if engine == "ggml":
        fn = _ggml_quantize_chunk()
        assert fn is not None
        out = np.empty((nrows, ncols // block * size), dtype=np.uint8)
        # ctypes releases the GIL for the call: the encoding threads really run in parallel.
        weights = None
        if importance is not None:
            weights = np.ascontiguousarray(importance, dtype=F32)
            if weights.shape != (ncols,):
                raise ValueError(f"importance of shape {weights.shape} for rows of {ncols} columns")
        fn(GGML_TYPES[qtype], rows.ctypes.data, out.ctypes.data, 0, nrows, ncols,
           None if weights is None else weights.ctypes.data)
        return out
    with np.errstate(all="ignore"):
        encoded = encoder(qtype)(rows.reshape(-1, block))
    return encoded.reshape(nrows, ncols // block * size)
