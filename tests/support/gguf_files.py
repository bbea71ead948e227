"""GGUF files written by mreg's writer directly (no CLI, no verification) and read back tensor by tensor, for the
tests that compare bytes with llama.cpp's own tools."""

from __future__ import annotations

from pathlib import Path

from converters.gguf import imatrix
from converters.gguf.converter import write
from converters.gguf.model import SafetensorsReader
from converters.gguf.plan import plans


def mreg_file(src: Path, file_type: str, dest: Path, imp: imatrix.Importance | None = None) -> Path:
    """`src` written as `file_type` (with the importance matrix `imp`, if any) at `dest`."""
    (p,) = plans(src, sorted(src.glob("*.safetensors")), [file_type], "tiny", has_imatrix=[imp is not None])
    reader = SafetensorsReader()
    try:
        write([p], [dest], reader, workers=2, importance=[imp])
    finally:
        reader.close()
    return dest


def calibrated_llama(root: Path, ctx: int) -> tuple[Path, Path, Path, Path]:
    """A bf16 llama (GQA 4, 256 wide: K-quant blocks fit), a 2,000-character slice of the shipped calibration text,
    the model's F32 GGUF and mreg's importance matrix of it in `ctx`-token chunks: (src, text, f32, matrix)."""
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(root / "src", dtype="bfloat16", vocab_size=384, hidden_size=256, intermediate_size=256,
                           num_heads=4, num_kv_heads=1, num_layers=2)
    text = root / "calibration.txt"
    text.write_text(imatrix.DEFAULT_CALIBRATION.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    f32 = mreg_file(src, "F32", root / "tiny-F32.gguf")
    ours = root / "mreg.imatrix.gguf"
    imatrix.compute(src, text, ours, ctx, text.name)
    return src, text, f32, ours


def tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a GGUF file: its type's name and its bytes."""
    import gguf

    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in gguf.GGUFReader(path).tensors}
