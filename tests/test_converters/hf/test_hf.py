"""`mreg convert --to hf`: the snapshot as is, every file's digest checked and every float tensor read for NaN/Inf."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert, integrity_refusal
from support.hostile import SAFETENSORS_DAMAGE
from support.tiny_models import set_value

from converters.hf import weights


@pytest.mark.parametrize(("dtype", "value"), [("float32", math.nan), ("float32", math.inf), ("bfloat16", math.nan),
                                              ("float16", -math.inf)])
def test_a_nan_or_inf_weight_fails_and_publishes_nothing(dtype: str, value: float, mreg: Any,
                                                         tiny_model: Callable[..., Path], store_root: Path) -> None:
    src = set_value(tiny_model("llama", dtype=dtype), "model.layers.1.mlp.up_proj.weight", 1000, value)
    r = mreg("convert", src, "--to", "hf", "--name", "m", "--json")
    err = integrity_refusal(r, store_root, "m", "tensor model.layers.1.mlp.up_proj.weight has 1 NaN/Inf value")
    record = err["details"]["verification"]
    assert record["status"] == "failed" and record["metrics"]["nonfinite_values"] == 1.0
    assert record["tolerance"]["nonfinite_values"] == 0.0


def test_a_finite_model_passes_and_every_float_tensor_was_read(mreg: Any, tiny_model: Callable[..., Path],
                                                              store_root: Path) -> None:
    src = tiny_model("llama", shards=2)
    doc = convert(mreg, src, "hf")
    art, _ = artifact(store_root, "m", doc["version"], "hf")
    v = art["verification"]
    assert v["status"] == "passed" and v["detail"] is None and "NaN and Inf" in v["method"]
    assert v["metrics"]["nonfinite_values"] == 0.0 and v["metrics"]["float_tensors"] == 21.0


def test_chunks_cover_every_value_once(tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks far smaller than a tensor, and not a multiple of its element size, still see each value once."""
    monkeypatch.setattr(weights, "CHUNK_BYTES", 1001)
    src = tiny_model("llama", dtype="float16")
    for index in (0, 499, 500, 501, 64 * 128 - 1):  # chunk edges (500 halves) and the tensor's last value
        set_value(src, "model.layers.0.mlp.down_proj.weight", index, math.inf)
    found = weights.scan({"model.safetensors": src / "model.safetensors"})
    assert found.nonfinite == {"model.layers.0.mlp.down_proj.weight": 5}


@pytest.mark.parametrize(("dtype", "values", "nonfinite", "nan"), [
    # value bits of each format: 1, max finite, +Inf, -Inf, NaN, -NaN (E4M3 and E8M0 have no Inf)
    ("F64", [0x3FF0_0000_0000_0000, 0x7FEF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, 0xFFF0_0000_0000_0000,
             0x7FF8_0000_0000_0000, 0xFFF0_0000_0000_0001], 4, 2),
    ("F32", [0x3F80_0000, 0x7F7F_FFFF, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFF80_0001], 4, 2),
    ("F16", [0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0xFC01], 4, 2),
    ("BF16", [0x3F80, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0xFF81], 4, 2),
    ("F8_E5M2", [0x3C, 0x7B, 0x7C, 0xFC, 0x7E, 0xFD], 4, 2),
    ("F8_E4M3", [0x38, 0x7E, 0xFE, 0x7F, 0xFF], 2, 2),
    ("F8_E8M0", [0x7F, 0xFE, 0xFF], 1, 1),
])
def test_every_float_format_nan_and_inf_by_their_bits(dtype: str, values: list[int], nonfinite: int, nan: int,
                                                      tmp_path: Path) -> None:
    import os

    import numpy as np

    raw = np.asarray(values, dtype=weights.NONFINITE_BITS[dtype][0]).tobytes()
    (tmp_path / "t").write_bytes(raw)
    fd = os.open(tmp_path / "t", os.O_RDONLY)
    try:
        assert weights.count_nonfinite(fd, dtype, 0, len(raw)) == nonfinite
        assert weights.count_nonfinite(fd, dtype, 0, len(raw), nan_only=True) == nan
    finally:
        os.close(fd)


@pytest.mark.parametrize(("path", "content", "error", "says"), [
    ("model.safetensors", b"\x10" * 4096, "InvalidSafetensors", "model.safetensors is not a valid safetensors file"),
    ("sub/model.safetensors", b"\x10" * 4096, "InvalidSafetensors", "sub/model.safetensors is not a valid"),
    ("config.json", b'{"model_type": "llama",', "InvalidConfig", "config.json is not JSON"),
    ("config.json", b"[1, 2]", "InvalidConfig", "config.json is JSON but not an object (it is an array)"),
    ("tokenizer.json", b"\xff\xfe", "InvalidConfig", "tokenizer.json is not JSON"),
    ("text_encoder/config.json", b"null", "InvalidConfig",
     "text_encoder/config.json is JSON but not an object (it is null)"),
])
def test_a_snapshot_no_loader_can_parse_is_refused_before_anything_is_placed(
        path: str, content: bytes, error: str, says: str, mreg: Any, tiny_model: Callable[..., Path],
        store_root: Path) -> None:
    """The identity converter checks structure too: it published random bytes named .safetensors as `passed`."""
    src = tiny_model("llama")
    (src / path).parent.mkdir(exist_ok=True)
    (src / path).write_bytes(content)
    r = mreg("convert", src, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 4, r.stderr
    err = r.json["error"]
    assert err["type"] == error and says in err["message"] and "\n" not in err["message"] and err["hint"]
    assert not (store_root / "models" / "m" / "versions" / "1").exists(), "nothing published"
    assert not [p for p in (store_root / "blobs").rglob("*") if p.is_file()], "nothing placed"


@pytest.mark.parametrize("how", sorted(SAFETENSORS_DAMAGE))
def test_mreg_refuses_the_headers_the_safetensors_library_refuses(how: str, tiny_model: Callable[..., Path]) -> None:
    """Every damage of the hostile corpus is refused by the safetensors library as well as by mreg's reader:
    mreg's reader is not stricter than the loaders on these, nor laxer."""
    from safetensors import safe_open

    from registry.convert.safetensors import InvalidSafetensors, read_header

    path = tiny_model("llama") / "model.safetensors"
    read_header(path)  # the undamaged file passes both
    with safe_open(path, "numpy"):
        pass
    path.write_bytes(SAFETENSORS_DAMAGE[how](path.read_bytes()))
    with pytest.raises(InvalidSafetensors, match=r"model\.safetensors is not a valid safetensors file"):
        read_header(path)
    with pytest.raises(Exception), safe_open(path, "numpy") as f:  # noqa: B017 - its error types vary by version
        list(f.keys())
