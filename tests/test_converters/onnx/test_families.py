"""ONNX export of the families beyond the Llama-likes, verified as the others are: Phi-3 with and without a KV
cache (16 greedy tokens against transformers for two left-padded prompts); Gemma 2 (eager attention: no SDPA path
for its soft-capping) and Gemma 3 for logits only, their sliding-window caches refused for with-past; the
mixtures of experts refused before any work (the exporter cannot write their routing), each with the reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")


@pytest.mark.parametrize("kind", ["phi3", "gemma2", "gemma3"])
def test_logits_only(kind: str, mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    doc = convert(mreg, tiny_model(kind), "onnx")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    assert art["verification"]["status"] == "passed", art["verification"]["detail"]


@pytest.mark.parametrize("kind", ["phi3"])
def test_with_past_generates_like_transformers(kind: str, mreg: Any, store_root: Path,
                                               tiny_model: Callable[..., Path]) -> None:
    doc = convert(mreg, tiny_model(kind), "onnx:with-past")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    m, tol = v["metrics"], v["tolerance"]
    assert v["status"] == "passed", v["detail"]
    assert m["generation.tokens_equal"] == 1.0 == tol["generation.tokens_equal"]
    assert m["generation.tokens"] == 32.0
    assert m["generation.nonfinite"] == 0.0


@pytest.mark.parametrize(("kind", "target"), [("qwen3moe", "onnx"), ("mixtral", "onnx"),
                                              ("gemma2", "onnx:with-past"), ("gemma3", "onnx:with-past")])
def test_what_does_not_export_is_refused_with_the_reason(kind: str, target: str, mreg: Any, store_root: Path,
                                                         tiny_model: Callable[..., Path]) -> None:
    r = mreg("convert", tiny_model(kind), "--to", target, "--name", "m", "--json")
    assert r.exit_code == 2, r.stdout
    error = r.json["error"]
    assert "not supported" in error["message"] and "--to gguf" in error["hint"]
    assert not (store_root / "models" / "m").exists()
