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


def tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a GGUF file: its type's name and its bytes."""
    import gguf

    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in gguf.GGUFReader(path).tensors}
