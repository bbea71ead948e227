"""ONNX export of the families beyond the Llama-likes, verified as the others are (three shapes; with past, 16 greedy
tokens from two left-padded prompts through the KV cache, against transformers' generate): Phi-3; Gemma 2 (eager
attention: no SDPA path for its soft-capping) and Gemma 3 with a KV cache for both their sliding-window and their
global layers (windows of 4 tokens, prompts of 10 to 20: the generation runs well past the window); the mixtures of
experts (Qwen3-MoE, Mixtral, Qwen2-MoE with its shared expert), whose routing the graph computes per token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")


@pytest.mark.parametrize("kind", ["phi3", "qwen3moe"])
@pytest.mark.slow
def test_logits_only(kind: str, mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    doc = convert(mreg, tiny_model(kind), "onnx")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    assert art["verification"]["status"] == "passed", art["verification"]["detail"]
    assert art["verification"]["metrics"]["logits.top1_agreement"] == 1.0


KINDS_WITH_PAST = ["phi3", "granite", "olmo2", "gemma", "gemma2", "gemma3", "qwen3moe", "mixtral", "qwen2moe"]


@pytest.mark.parametrize("kind", KINDS_WITH_PAST)
@pytest.mark.slow
def test_with_past_generates_like_transformers(kind: str, mreg: Any, store_root: Path,
                                               tiny_model: Callable[..., Path]) -> None:
    import onnx

    doc = convert(mreg, tiny_model(kind), "onnx:with-past")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    m, tol = v["metrics"], v["tolerance"]
    assert v["status"] == "passed", v["detail"]
    assert m["generation.tokens_equal"] == 1.0 == tol["generation.tokens_equal"]
    assert m["generation.tokens"] == 32.0
    assert m["generation.nonfinite"] == 0.0
    assert m["logits.max_abs_diff"] <= tol["logits.max_abs_diff"]
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False).graph
    layers = sum(1 for i in graph.input if i.name.endswith(".key"))
    assert layers == (6 if kind == "gemma3" else 2), "a cache input for every layer, sliding and global alike"
    for layer in range(layers):
        assert m[f"present.{layer}.key.max_abs_diff"] <= tol[f"present.{layer}.key.max_abs_diff"]
    if kind in ("qwen3moe", "mixtral", "qwen2moe"):
        experts = {"qwen3moe": 8, "mixtral": 4, "qwen2moe": 4}[kind]
        # Every expert of every layer finds its tokens at run time (NonZero): no routing is fixed by the trace.
        assert sum(1 for n in graph.node if n.op_type == "NonZero") >= experts * layers
