"""`--to onnx:fp16` in half precision end to end, and the memory plan that refuses what cannot fit.

fp16 loads, traces and writes the model in float16 (no float32 copy of the weights at any point); its
reference is float32 compute over those weights, one module upcast at a time. Qwen3, Gemma 2 (soft-caps, a
sliding window the generation runs past) and Qwen3-MoE (eight experts routed per token) each generate 16 tokens
from two prompts through the with-past graph, as transformers does. A checkpoint whose
weights float16 holds exactly shows that this reference is the float32 model's own. The plan is
read from the safetensors headers before any weight is loaded; a model that cannot fit is refused
with exit 7 and both numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")


@pytest.mark.parametrize("kind", ["qwen3", "gemma2", "qwen3moe"])
@pytest.mark.slow
def test_fp16_exports_from_a_float16_model_and_generates(kind: str, mreg: Any, store_root: Path,
                                                         tiny_model: Callable[..., Path]) -> None:
    import onnx

    from converters.onnx import export as ex

    loaded: list[bool] = []
    real = ex.load
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "load", lambda d, task, half=False, config=None:
                   loaded.append(half) or real(d, task, half, config))
        doc = convert(mreg, tiny_model(kind), "onnx:fp16,with-past")
    assert loaded == [True], "loaded once, in float16"
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert v["status"] == "passed", v["detail"]
    assert v["metrics"]["logits.min_cosine"] >= 0.999 and v["metrics"]["weights.float16_weight_nonfinite"] == 0.0
    assert v["metrics"]["generation.tokens"] == 32.0 and v["metrics"]["generation.tokens_equal"] == 1.0
    assert v["metrics"]["logits.top1_agreement"] == 1.0
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False).graph
    weights = [t for t in graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights), "weights written in float16"
    types = {i.name: i.type.tensor_type.elem_type for i in [*graph.input, *graph.output]}
    assert types["logits"] == onnx.TensorProto.FLOAT and types["present.0.key"] == onnx.TensorProto.FLOAT16
    if kind == "qwen3moe":  # every expert of both layers written in float16 and routed at run time
        # The weights are written as the model holds them (converters.onnx.initializers): transformers keeps a
        # layer's experts stacked, (8, rows, columns), and the graph takes each expert's slice at run time.
        stacked = [t for t in graph.initializer if len(t.dims) == 3 and t.dims[0] == 8]
        assert len(stacked) >= 2 * 2 and all(t.data_type == onnx.TensorProto.FLOAT16 for t in stacked), (
            "gate-and-up and down of eight experts in two layers")
        assert sum(1 for n in graph.node if n.op_type == "NonZero") >= 8 * 2


def test_the_half_reference_is_the_float32_models_own(tmp_path: Path) -> None:
    """Weights float16 holds exactly: the module-by-module float32 reference equals a float32 load's."""
    import numpy as np
    import torch
    from support.tiny_models import build_tiny_llama

    from converters.onnx import export as ex
    from converters.onnx import upcast
    from converters.onnx import verify as onnx_verify

    src = build_tiny_llama(tmp_path / "f16", dtype="float16", tie_word_embeddings=True)
    half, tokenizer = ex.load(src, "text-generation", half=True)
    full, _ = ex.load(src, "text-generation")
    assert half.dtype == torch.float16 and full.dtype == torch.float32
    sig = ex.signature(full, tokenizer, "text-generation", True)
    probe = onnx_verify.probes(full, tokenizer, sig)
    a, b = onnx_verify.reference(half, sig, probe), onnx_verify.reference(full, sig, probe)
    for x, y in zip(a.cases, b.cases, strict=True):
        assert np.abs(x["logits"] - y["logits"]).max() < 1e-5 and x["present.1.value"].dtype == np.float32
    assert a.generated is not None and b.generated is not None and np.array_equal(a.generated, b.generated)
    assert all(p.dtype == torch.float16 for p in half.parameters()), "every weight is float16 again afterwards"
    assert half.lm_head.weight is half.model.embed_tokens.weight, "tied weights stay tied"
    with torch.no_grad():
        half.model.embed_tokens.weight[0, 0] = 70000.0  # beyond float16's range: Inf
    assert upcast.nonfinite(half) == {"model.embed_tokens.weight": 1}


def test_a_model_that_cannot_fit_is_refused_before_loading(mreg: Any, store_root: Path, tmp_path: Path,
                                                           tiny_model: Callable[..., Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from converters.onnx import export as ex
    from converters.onnx import memory

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(ex, "load", never)
    monkeypatch.setattr(memory, "available_memory", lambda: (200 << 20, "a test's 200 MiB"))
    r = mreg("convert", tiny_model("llama"), "--to", "onnx:fp16", "--name", "m", "--json")
    assert r.exit_code == 7, r.stdout
    error = r.json["error"]
    assert "needs about" in error["message"] and "0.2 GiB available (a test's 200 MiB)" in error["message"]
    assert "\n" not in error["message"] and "gguf" in error["hint"]
    assert not (store_root / "models" / "m").exists()


def test_the_plan_counts_the_headers_and_scales_with_precision(tiny_model: Callable[..., Path]) -> None:
    from converters.onnx import memory
    from registry.convert.safetensors import read_header

    src = tiny_model("qwen3")
    headers = [read_header(p) for p in src.glob("*.safetensors")]
    count = sum(int(__import__("math").prod(e.shape)) for h in headers for e in h.values())
    half, full = memory.plan(headers, half=True), memory.plan(headers, half=False)
    dynamo = memory.plan(headers, half=True, weightless=False)
    assert half.parameters == full.parameters == count and full.weight_bytes == 2 * half.weight_bytes == 4 * count
    assert half.needed == int(max(memory.WEIGHT_FACTOR * 2 * count + half.largest,
                                  3 * half.largest + memory.PROBE_BYTES)) + memory.BASE_BYTES, "no export phase"
    assert dynamo.needed == half.needed, "a tiny model: ONNX Runtime's phase, whichever the exporter"
    g = 1 << 30
    assert memory.needed(g, 0, half=True, weightless=False) == int(g * memory.INLINE_FACTOR) + memory.BASE_BYTES
    assert memory.needed(4 * g, 0, half=True, weightless=False) == int(4 * g * memory.FILE_FACTOR) + memory.BASE_BYTES
    assert full.needed == int(4 * count * memory.FP32_FACTOR) + memory.BASE_BYTES
    assert half.available == full.available > 0


def test_the_plan_at_seven_billion_parameters() -> None:
    """Qwen2.5-7B's shapes (untied, 7.6 B): what the README gives. Traced without its weights it needs the model's
    phase, 21.8 GiB, under a quiet 24 GB machine's 22.3; with dynamo (which holds copies of the weights) 34.7 GiB."""
    from converters.onnx import memory
    from registry.convert.safetensors import TensorEntry

    h, inter, v, layers, kv = 3584, 18944, 152064, 28, 512
    shapes = [(v, h), (v, h), (h,)] + [s for _ in range(layers) for s in
                                       [(h, h), (kv, h), (kv, h), (h, h), (h,), (kv,), (kv,), (inter, h), (inter, h),
                                        (h, inter), (h,), (h,)]]
    header = {str(i): TensorEntry(str(i), "BF16", s, 0, 0) for i, s in enumerate(shapes)}
    p, dynamo = memory.plan([header], half=True), memory.plan([header], half=True, weightless=False)
    assert 7.6e9 < p.parameters < 7.7e9 and p.largest == 4 * v * h
    assert p.needed == int(memory.WEIGHT_FACTOR * p.weight_bytes + p.largest) + memory.BASE_BYTES
    assert 21.6 < p.needed / (1 << 30) < 22.0, p.needed / (1 << 30)
    assert 34.3 < dynamo.needed / (1 << 30) < 35.0, dynamo.needed / (1 << 30)
    assert memory.needed(2 << 30, 3 << 30, half=True, weightless=True) == \
        (9 << 30) + memory.PROBE_BYTES + memory.BASE_BYTES, \
        "ONNX Runtime's phase (3 x the largest tensor) where it is larger than the weights"


def test_available_memory_reads_meminfo_and_the_tightest_cgroup(tmp_path: Path) -> None:
    from converters.onnx import memory

    found, where = memory.available_memory()
    meminfo = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemAvailable:"))
    assert 0 < found <= meminfo * 1.05 and where
    # cgroup v1 (a namespace's view: the own group mounted at the root) and v2, with a limit on a parent.
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(8 << 30))
    (v1 / "memory" / "memory.usage_in_bytes").write_text(str(6 << 30))
    (v1 / "memory" / "memory.stat").write_text(f"cache 0\ntotal_inactive_file {1 << 30}\n")
    (v1 / "memory" / "job" / "memory.limit_in_bytes").write_text(str(9223372036854771712))
    (v1 / "memory" / "job" / "memory.usage_in_bytes").write_text("1")
    (tmp_path / "cgroup1").write_text("5:memory:/job\n3:cpu:/other\n")
    room, where = memory._cgroup_headroom(v1, tmp_path / "cgroup1") or (0, "")
    assert room == 3 << 30 and "limit 8.0 GiB" in where
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "a" / "memory.max").write_text(str(4 << 30))
    (v2 / "a" / "memory.current").write_text(str(1 << 30))
    (v2 / "a" / "b" / "memory.max").write_text("max\n")
    (v2 / "a" / "b" / "memory.current").write_text(str(1 << 30))
    (tmp_path / "cgroup2").write_text("0::/a/b\n")
    assert memory._cgroup_headroom(v2, tmp_path / "cgroup2") == (3 << 30, f"cgroup {v2 / 'a' / 'memory.max'}: "
                                                                           "limit 4.0 GiB")
    (tmp_path / "none").write_text("0::/\n")
    assert memory._cgroup_headroom(tmp_path / "empty", tmp_path / "none") is None
