"""llama.cpp's logits on the converted file against mreg's float32 reference forward pass on the source.

The reference (converters.gguf.reference) streams the safetensors weights; test_gguf_reference.py
holds it equal to transformers. Only llama-cpp-python is needed here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

pytest.importorskip("llama_cpp")


@pytest.mark.parametrize(("kind", "spec"), [("llama", "F16"), ("qwen2", "Q8_0"), ("qwen3", "BF16"),
                                            ("mistral", "Q4_K_M"), ("llama-spm", "Q6_K"), ("qwen2", "Q2_K")])
@pytest.mark.slow
def test_logits_match_the_reference(kind: str, spec: str, mreg: Any, store_root: Path,
                                   tiny_model: Callable[..., Path]) -> None:
    from converters.gguf.verify import KL_BUDGET, LOGITS_KL, LOGITS_REL_DIFF

    art, _ = artifact(store_root, "m", convert(mreg, tiny_model(kind), f"gguf:{spec}")["version"], "gguf")
    v = art["verification"]
    m = v["metrics"]
    assert v["status"] == "passed" and m["logits_positions"] >= 10
    if spec in LOGITS_KL:  # integrity: enforced
        assert m["kl_divergence"] <= LOGITS_KL[spec] == v["tolerance"]["kl_divergence"]
        assert v["budget"] == {}
    else:  # quality: recorded against its budget, which a tiny model meets
        assert "kl_divergence" not in v["tolerance"]
        assert m["kl_divergence"] <= KL_BUDGET[spec] == v["budget"]["kl_divergence"]
    assert 0.0 <= m["top1_agreement"] <= 1.0
    assert m["kl_divergence_p99"] >= m["kl_divergence"] and m["perplexity_reference"] > 1.0
    assert m["perplexity_ratio"] == pytest.approx(m["perplexity_llama_cpp"] / m["perplexity_reference"])
    if spec in LOGITS_REL_DIFF:
        assert m["logits_max_rel_diff"] <= LOGITS_REL_DIFF[spec] == v["tolerance"]["logits_max_rel_diff"]
        assert m["top1_agreement"] >= 0.9
