"""Tiny models for the GGUF converter: one per architecture, all real Hugging Face directories.

llama and qwen2 come from tests/support/tiny_models/ as they are; mistral is the llama directory with a
Mistral config; qwen3 gets its own weights (explicit head_dim different from hidden/heads,
per-head q/k norms, no biases); the SentencePiece variant replaces the BPE tokenizer of the
llama directory with a tokenizer.model trained offline on the spot.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny_models import build_tiny_llama, rewrite_config, write_safetensors

CORPUS = [
    "Hello world! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog, and then the dog runs after the fox.",
    "A model registry keeps track of every model that a team trains, downloads or ships.",
    "1, 2, 3, 4, 5 and 10, 20, 30, 100, 12345. don't won't it's I'm we'll they've",
    "über café naïve — “quotes” and 日本語 with two  spaces,\ttabs and\nnew lines.",
]


def _values(seed: str, shape: tuple[int, ...], norm: bool) -> bytes:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little"))
    v = rng.standard_normal(shape).astype(np.float32)
    v = 1.0 + 0.01 * v if norm else 0.02 * v
    return v.astype("<f4").tobytes()


def build_mistral(dest: Path, **kw: Any) -> Path:
    """A MistralForCausalLM directory: llama weights and tokenizer, Mistral config."""
    build_tiny_llama(dest, **kw)
    rewrite_config(dest, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
    for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
        config = json.loads((dest / "config.json").read_text())
        config.pop(key, None)
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dest


def build_qwen3(dest: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                head_dim: int = 32, intermediate: int = 128, vocab: int = 320, tied: bool = True) -> Path:
    """A Qwen3ForCausalLM directory: qwen2's tokenizer, q/k norms, head_dim != hidden / heads."""
    build_tiny_llama(dest, model_type="qwen2", hidden_size=hidden, num_layers=layers, num_heads=heads,
                     num_kv_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                     tie_word_embeddings=tied)
    for p in dest.glob("*.safetensors*"):
        p.unlink()
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        pre = f"model.layers.{i}."
        shapes += [(pre + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
                   (pre + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
                   (pre + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
                   (pre + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
                   (pre + "self_attn.q_norm.weight", (head_dim,)), (pre + "self_attn.k_norm.weight", (head_dim,)),
                   (pre + "mlp.gate_proj.weight", (intermediate, hidden)),
                   (pre + "mlp.up_proj.weight", (intermediate, hidden)),
                   (pre + "mlp.down_proj.weight", (hidden, intermediate)),
                   (pre + "input_layernorm.weight", (hidden,)), (pre + "post_attention_layernorm.weight", (hidden,))]
    shapes.append(("model.norm.weight", (hidden,)))
    if not tied:
        shapes.append(("lm_head.weight", (vocab, hidden)))
    write_safetensors(dest / "model.safetensors",
                      [(n, "float32", s, _values(n, s, "norm" in n)) for n, s in shapes], {"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    for key in ("max_window_layers", "use_sliding_window", "sliding_window"):
        config.pop(key, None)
    config.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=head_dim, attention_bias=False)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dest


def build_spm_llama(dest: Path, add_dummy_prefix: bool = True, **kw: Any) -> Path:
    """A llama directory whose tokenizer is a SentencePiece tokenizer.model (Llama 2 style, byte fallback; Gemma's
    without the dummy prefix)."""
    spm = pytest.importorskip("sentencepiece")
    import io

    vocab = kw.pop("vocab_size", 400)
    build_tiny_llama(dest, vocab_size=vocab, **kw)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, vocab_size=vocab, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, minloglevel=2, add_dummy_prefix=add_dummy_prefix,
    )
    (dest / "tokenizer.model").write_bytes(model.getvalue())
    (dest / "tokenizer.json").unlink()
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="LlamaTokenizer", legacy=True)
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def build_llama3_rope(dest: Path, **kw: Any) -> Path:
    """A llama with Llama 3.1's rope scaling, which llama.cpp reads as a rope_freqs tensor."""
    build_tiny_llama(dest, **kw)
    rewrite_config(dest, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    return dest


def build_with_transformers(dest: Path, kind: str, *, hidden: int = 64, layers: int = 2, spm: bool = True,
                            **config: Any) -> Path:
    """A tiny random model of a family transformers defines (its own config class and initialization), saved as
    safetensors beside a tiny tokenizer (SentencePiece, or the llama directory's BPE); norm weights are random
    too, so that a convention such as Gemma's `1 + weight` shows in the logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    if spm:  # Gemma's SentencePiece models add no dummy prefix (llama.cpp's converter writes that down for them)
        build_spm_llama(dest, add_dummy_prefix=not kind.startswith("gemma"))
    else:
        build_tiny_llama(dest, model_type="qwen2")
    vocab = json.loads((dest / "config.json").read_text())["vocab_size"]
    for p in [*dest.glob("*.safetensors*"), dest / "config.json"]:
        p.unlink()
    classes = {"phi3": "Phi3Config", "granite": "GraniteConfig", "olmo2": "Olmo2Config", "gemma": "GemmaConfig",
               "gemma2": "Gemma2Config",
               "gemma3": "Gemma3TextConfig", "qwen3moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig",
               "qwen2moe": "Qwen2MoeConfig"}
    cfg = getattr(transformers, classes[kind])(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                               num_attention_heads=4, num_key_value_heads=2,
                                               bos_token_id=1, eos_token_id=2, pad_token_id=None,
                                               **{"intermediate_size": 128, **config})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # Gemma's norms start at 0 (they multiply by 1 + weight), the others at 1
                param.copy_(torch.randn_like(param) * 0.1 + (0.0 if kind.startswith("gemma") else 1.0))
    model.save_pretrained(dest)
    return dest


#: Phi-3 mini's shape of things (separate output, full rotary) at 256 wide, so that K-quant blocks fit and the
#: mix rules choose; Phi-4-mini's (tied embeddings, 3/4 rotary, longrope with factor tensors) at 64.
PHI3 = {"hidden": 256}
PHI3_LONGROPE = {"tie_word_embeddings": True, "max_position_embeddings": 256, "original_max_position_embeddings": 64,
                 "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                     "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                     "long_factor": [2.0 + 0.5 * i for i in range(6)],
                                     "original_max_position_embeddings": 64}}


#: Granite 3's multipliers (embeddings x12, attention scale 1/64, residual branches x0.22, logits / 8), tied.
GRANITE = {"embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
           "logits_scaling": 8.0, "tie_word_embeddings": True}
#: Gemma (1): Gemma's norms, scaled embeddings and gelu-tanh, a head size of its own, tied embeddings.
GEMMA = {"head_dim": 16}
#: Gemma 2: both soft-caps, a window of 4 on layer 0 (layer 1 is global), a query scale from query_pre_attn_scalar.
GEMMA2 = {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4, "attn_logit_softcapping": 50.0,
          "final_logit_softcapping": 30.0}
#: Gemma 3: six layers, so that the sixth is global (llama.cpp's fixed pattern), with its own rope base; q/k norms.
GEMMA3 = {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4, "layers": 6,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}


#: Qwen3-MoE: eight experts (llama.cpp's quantizer has rules for exactly eight), two per token, 256 wide so that
#: K-quant blocks fit, the qwen2 BPE tokenizer.
QWEN3MOE = {"hidden": 256, "spm": False, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256, "norm_topk_prob": True}


#: Mixtral: four experts, two per token, Llama's SentencePiece tokenizer and q/k permutation (GGUF arch llama).
MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64}


#: Qwen2-MoE (Qwen1.5-MoE's layout): four experts, two per token, a shared expert behind a sigmoid gate, q/k/v biases.
QWEN2MOE = {"spm": False, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64, "norm_topk_prob": False}


BUILDERS: dict[str, Callable[..., Path]] = {
    "llama": lambda d, **kw: build_tiny_llama(d, **kw),
    "qwen2": lambda d, **kw: build_tiny_llama(d, model_type="qwen2", **kw),
    "mistral": build_mistral,
    "qwen3": build_qwen3,
    "llama-spm": build_spm_llama,
    "llama3-rope": build_llama3_rope,
    "phi3": lambda d, **kw: build_with_transformers(d, "phi3", **{**PHI3, **kw}),
    "phi3-longrope": lambda d, **kw: build_with_transformers(d, "phi3", **{**PHI3_LONGROPE, **kw}),
    "gemma": lambda d, **kw: build_with_transformers(d, "gemma", **{**GEMMA, **kw}),
    "granite": lambda d, **kw: build_with_transformers(d, "granite", **{**GRANITE, **kw}),
    # OLMo 2: norms after attention and the MLP only, q/k norms over all heads at once; a BPE tokenizer (llama.cpp's
    # converter reads OLMo's vocabulary as GPT-2's)
    "olmo2": lambda d, **kw: build_with_transformers(d, "olmo2", **{"spm": False, **kw}),
    "gemma2": lambda d, **kw: build_with_transformers(d, "gemma2", **{**GEMMA2, **kw}),
    "gemma3": lambda d, **kw: build_with_transformers(d, "gemma3", **{**GEMMA3, **kw}),
    "qwen3moe": lambda d, **kw: build_with_transformers(d, "qwen3moe", **{**QWEN3MOE, **kw}),
    # Mixtral: four experts, two per token, Llama's SentencePiece tokenizer and q/k permutation
    "mixtral": lambda d, **kw: build_with_transformers(d, "mixtral", **{**MIXTRAL, **kw}),
    "qwen2moe": lambda d, **kw: build_with_transformers(d, "qwen2moe", **{**QWEN2MOE, **kw}),
}


@pytest.fixture(autouse=True)
def fresh_gpu_probe() -> None:
    """Each test starts with no remembered GPU probe (mreg probes once per process; tests fake GPUs)."""
    from converters.tensorrt.binding import _probe_gpus

    _probe_gpus.cache_clear()


@pytest.fixture
def tiny_model(tmp_path: Path) -> Callable[..., Path]:
    """Build a tiny model of an architecture into tmp_path and return its directory."""

    def build(kind: str, name: str | None = None, **kw: Any) -> Path:
        dest = tmp_path / (name or f"tiny-{kind}")
        if dest.exists():
            shutil.rmtree(dest)
        return BUILDERS[kind](dest, **kw)

    return build
