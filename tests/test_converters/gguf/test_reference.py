"""mreg's streaming float32 forward pass against transformers' float32 logits, architecture by architecture."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny_models import rewrite_config

from converters.gguf import reference as gguf_reference
from converters.gguf.reference import ReferenceUnsupported, reference_logits

IDS = [1, 17, 260, 5, 99, 300, 42, 7, 150, 3, 211, 64, 8, 270, 33, 120, 2, 319, 77, 11]


def _transformers_logits(directory: Path, ids: list[int]) -> np.ndarray[Any, Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return np.asarray(model(torch.tensor([ids])).logits[0].numpy())


def _assert_matches_transformers(directory: Path, ids: list[int] = IDS) -> float:
    got = reference_logits(directory, ids)
    ref = _transformers_logits(directory, ids)
    assert got.dtype == np.float32 and got.shape == ref.shape
    diff = float(np.abs(got - ref).max())
    assert diff <= 1e-5 * (1 + float(np.abs(ref).max())), diff
    return diff


@pytest.mark.parametrize(
    ("kind", "kw"),
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "dtype": "bfloat16"}),
        ("llama", {"dtype": "float16", "shards": 3}),
        ("qwen2", {}),
        ("qwen2", {"dtype": "bfloat16"}),
        ("qwen3", {}),
        ("qwen3", {"tied": False}),
        ("mistral", {}),
        ("llama3-rope", {}),
        ("phi3", {"hidden": 64}),
        ("phi3-longrope", {}),
        ("granite", {}),
        ("olmo2", {}),
        ("gemma", {}),
        ("gemma2", {}),
        ("gemma3", {}),
        ("gemma3", {"final_logit_softcapping": 20.0, "layers": 2}),
        ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
        ("qwen3moe", {"hidden": 64, "head_dim": 16, "moe_intermediate_size": 32}),
        ("qwen3moe", {"hidden": 64, "head_dim": 16, "moe_intermediate_size": 32, "norm_topk_prob": False,
                      "num_experts": 4, "num_experts_per_tok": 3}),
        ("mixtral", {}),
        ("qwen2moe", {}),
        ("qwen2moe", {"norm_topk_prob": True}),
    ],
)
@pytest.mark.slow
def test_logits_equal_transformers(kind: str, kw: dict[str, Any], tiny_model: Callable[..., Path]) -> None:
    _assert_matches_transformers(tiny_model(kind, **kw))


@pytest.mark.parametrize(
    "rope",
    [
        {"type": "linear", "factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_rope_scaling_equals_transformers(rope: dict[str, Any], tiny_model: Callable[..., Path]) -> None:
    _assert_matches_transformers(rewrite_config(tiny_model("llama"), rope_scaling=rope, rope_theta=50000.0))


def test_rope_parameters_as_transformers_5_saves_them(tiny_model: Callable[..., Path]) -> None:
    directory = tiny_model("llama")
    config = json.loads((directory / "config.json").read_text())
    del config["rope_theta"], config["rope_scaling"]
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0}
    (directory / "config.json").write_text(json.dumps(config))
    _assert_matches_transformers(directory)


def test_phi3_long_factors_past_the_original_context(tiny_model: Callable[..., Path]) -> None:
    """70 tokens, past the original 64: transformers and the reference switch to the long factors."""
    _assert_matches_transformers(tiny_model("phi3-longrope"), [(7 * i + 3) % 400 for i in range(70)])


def test_mistral_sliding_window_shorter_than_the_prompt(tiny_model: Callable[..., Path]) -> None:
    _assert_matches_transformers(rewrite_config(tiny_model("mistral"), sliding_window=6))


def test_blocks_are_slices_of_the_matrices(tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny blocks and one or two workers give the same logits, and no read covers a whole matrix."""
    directory = tiny_model("qwen2")
    whole = reference_logits(directory, IDS, workers=1)
    reads: list[tuple[tuple[int, ...], int]] = []
    read = gguf_reference._Weights._read

    def spy(self: Any, t: Any, start: int, stop: int, out: Any) -> Any:
        reads.append((t.shape, stop - start))
        return read(self, t, start, stop, out)

    monkeypatch.setattr(gguf_reference._Weights, "_read", spy)
    monkeypatch.setattr(gguf_reference, "BLOCK_ELEMENTS", 256)
    sliced = reference_logits(directory, IDS, workers=2)
    np.testing.assert_allclose(sliced, whole, rtol=0, atol=1e-6)
    matrices = [(shape, rows) for shape, rows in reads if len(shape) == 2]
    assert matrices and all(rows * shape[1] <= 256 or rows == 1 for shape, rows in matrices)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic'"),
        ({"architectures": ["OlmoForCausalLM"]}, "architecture OlmoForCausalLM"),
    ],
)
def test_what_is_not_implemented_is_refused(
    change: dict[str, Any], message: str, tiny_model: Callable[..., Path]
) -> None:
    with pytest.raises(ReferenceUnsupported, match=message):
        reference_logits(rewrite_config(tiny_model("llama"), **change), IDS)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_model: Callable[..., Path]) -> None:
    with pytest.raises(ReferenceUnsupported, match="outside"):
        reference_logits(tiny_model("llama"), [1, 320])


def test_a_missing_tensor_is_named(tiny_model: Callable[..., Path]) -> None:
    directory = rewrite_config(tiny_model("llama"), num_hidden_layers=3)
    with pytest.raises(ReferenceUnsupported, match=r"no tensor model\.layers\.2\."):
        reference_logits(directory, IDS)
