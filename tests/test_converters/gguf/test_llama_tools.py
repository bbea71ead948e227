"""mreg's importance matrices and imatrix quantization against llama.cpp's own `llama-imatrix` and `llama-quantize`
(built from the sdist against the installed library by tests/support/llama_cpp_tools.py, once per cache).

The tolerance on the sums: llama.cpp's forward pass of the F32 file keeps its KV cache in F16 (keys and values
rounded to 11 significant bits before attention) and sums in float32 chunk by chunk; mreg's reference runs in
float32 with float64 sums. The rounding reaches every matrix after the first layer's attention: measured here,
0.03 % at most per matrix (relative L2), 0.13 % for the worst single column. 0.5 % per column leaves room for
another compiler's summation order, and stays far below what a wrong chunking, a missing BOS or a wrong token
count gives (those move sums by whole chunks' shares, and the counts exactly).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.gguf_files import calibrated_llama, mreg_file, tensors
from support.llama_cpp_tools import Tools, build, imatrix_command, quantize_command, run

from converters.gguf import imatrix

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the test extra")
gguf = pytest.importorskip("gguf")

#: Tokens per calibration chunk (llama-imatrix -c): the default, 512, would need a longer text.
CTX = 64

#: llama.cpp's converter or tools on real inputs: the slow lane (`-m "not slow"` leaves them out).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tools(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tools:
    """llama-imatrix and llama-quantize, built once per cache (skipped only where the sdist is not named)."""
    from support.llama_cpp_source import built_or_skip

    return built_or_skip(request, tmp_path_factory, "llama-cpp-tools", build)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, tools: Tools) -> dict[str, Path]:
    """A bf16 llama (GQA 4), its F32 GGUF, a slice of the shipped calibration text, mreg's importance matrix of it
    and `llama-imatrix`'s of the F32 file on the same text."""
    root = tmp_path_factory.mktemp("llama-tools")
    src, text, f32, ours = calibrated_llama(root, CTX)
    theirs = root / "llama.imatrix.gguf"
    run(imatrix_command(tools, f32, text, theirs, ctx=CTX))
    return {"src": src, "f32": f32, "text": text, "mreg": ours, "llama": theirs}


def test_llama_imatrix_gives_mregs_matrix(both: dict[str, Path]) -> None:
    """Same entries, chunking and token counts; sums within 0.5 % (the module docstring says why)."""
    ours, theirs = imatrix.read(both["mreg"]), imatrix.read(both["llama"])
    assert sorted(ours.sums) == sorted(theirs.sums)
    assert len(ours.sums) == 2 * 7  # q, k, v, output, gate, up, down of each layer
    assert (ours.chunk_count, ours.chunk_size) == (theirs.chunk_count, theirs.chunk_size) and ours.chunk_count >= 2
    for name in ours.sums:
        assert np.array_equal(ours.counts[name], theirs.counts[name]), name
        assert ours.counts[name][0] == ours.chunk_count * CTX, name
        np.testing.assert_allclose(ours.sums[name], theirs.sums[name], rtol=5e-3, atol=1e-6 * theirs.sums[name].max(),
                                   err_msg=name)


def test_the_files_have_one_layout(both: dict[str, Path]) -> None:
    """mreg writes what llama-imatrix writes: general.type imatrix, the same tensors, types and shapes, in order."""
    mine, real = gguf.GGUFReader(both["mreg"]), gguf.GGUFReader(both["llama"])
    assert mine.fields["general.type"].contents() == real.fields["general.type"].contents() == "imatrix"
    assert [(t.name, t.tensor_type.name, [int(d) for d in t.shape]) for t in mine.tensors] == [
        (t.name, t.tensor_type.name, [int(d) for d in t.shape]) for t in real.tensors]


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q3_K_S", "IQ4_XS", "IQ3_S", "IQ2_M"])
def test_llama_quantize_with_mregs_imatrix_writes_mregs_bytes(file_type: str, both: dict[str, Path], tools: Tools,
                                                              tmp_path: Path) -> None:
    """`llama-quantize --imatrix mreg.imatrix.gguf` accepts mreg's file and writes every tensor as mreg does."""
    ours = tensors(mreg_file(both["src"], file_type, tmp_path / "mreg.gguf", imatrix.read(both["mreg"])))
    run(quantize_command(tools, both["f32"], tmp_path / "llama.gguf", file_type, both["mreg"]))
    theirs = tensors(tmp_path / "llama.gguf")
    assert {n: t for n, (t, _) in ours.items()} == {n: t for n, (t, _) in theirs.items()}
    assert [n for n in ours if ours[n][1] != theirs[n][1]] == []


def test_mreg_with_llama_imatrixs_file_writes_llama_quantizes_bytes(both: dict[str, Path], tools: Tools,
                                                                    tmp_path: Path) -> None:
    """mreg reads the file llama-imatrix wrote and weights the encoder as llama-quantize does with it."""
    ours = tensors(mreg_file(both["src"], "Q4_K_M", tmp_path / "m.gguf", imatrix.read(both["llama"])))
    run(quantize_command(tools, both["f32"], tmp_path / "l.gguf", "Q4_K_M", both["llama"]))
    assert ours == tensors(tmp_path / "l.gguf")
