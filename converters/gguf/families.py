"""What llama.cpp reads for the architectures whose metadata is not Llama's: Phi-3, Gemma, Gemma 2, Gemma 3.

Each function returns the `{arch}.*` keys exactly as llama.cpp's converter writes them for that
architecture (conversion/phi.py, conversion/gemma.py) and any tensors it adds (Phi-3's longrope
factors). `norm_shift` is what the converter adds to a tensor's values: Gemma's RMSNorm multiplies by
`1 + weight`, and llama.cpp's converter stores the `+ 1` in the file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converters.gguf.quants.blocks import Floats

#: HF `architectures[0]` -> GGUF architecture, for the families this module describes.
FAMILIES = {"Phi3ForCausalLM": "phi3", "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
            "Gemma3ForCausalLM": "gemma3"}
#: The GGUF architectures whose RMSNorm multiplies by `1 + weight`.
GEMMAS = ("gemma", "gemma2", "gemma3")
#: The ids llama.cpp's converter gives Gemma's end-of-turn token whatever the vocabulary (written for CodeGemma;
#: its prefix/suffix/middle/separator ids have no key in the gguf writer, so only this one lands in the file).
GEMMA_EOT = 107
Metadata = list[tuple[str, Any]]


class FamilyError(ValueError):
    """config.json holds settings llama.cpp's converter would refuse for this family."""


def norm_shift(arch: str, hf_name: str) -> float:
    """The constant llama.cpp's converter adds to a tensor's values (Gemma's norms store `1 + weight`)."""
    return 1.0 if arch in GEMMAS and hf_name.endswith("norm.weight") else 0.0


def rope_params(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of the global (full-attention) layers, as llama.cpp's converter gathers them."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params = dict(params.get("full_attention", params))
    for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
        if key not in params and config.get(key) is not None:
            params[key] = config[key]
    if "rope_type" not in params and params.get("type") is not None:
        params["rope_type"] = params["type"]
    return params


def _common(arch: str, config: dict[str, Any], n: dict[str, int], eps: float) -> Metadata:
    return [(f"{arch}.context_length", n["context"]), (f"{arch}.embedding_length", n["n_embd"]),
            (f"{arch}.block_count", n["n_layer"]), (f"{arch}.feed_forward_length", n["n_ff"]),
            (f"{arch}.attention.head_count", n["n_head"]), (f"{arch}.attention.head_count_kv", n["n_head_kv"]),
            (f"{arch}.attention.layer_norm_rms_epsilon", eps)]


def phi3(config: dict[str, Any], n: dict[str, int], eps: float) -> tuple[Metadata, list[tuple[str, Floats]]]:
    """Phi-3/3.5/4-mini: partial rotary, original context, sliding window (0 for none) and longrope factors."""
    rope = rope_params(config)
    original = int(rope.get("original_max_position_embeddings") or n["context"])
    rope_dims = int(float(rope.get("partial_rotary_factor", 1.0)) * n["n_embd"]) // n["n_head"]
    meta: Metadata = [("phi3.context_length", n["context"]), ("phi3.rope.scaling.original_context_length", original),
                      *_common("phi3", config, n, eps)[1:],
                      ("phi3.rope.dimension_count", rope_dims),
                      ("phi3.rope.freq_base", float(rope.get("rope_theta", 10000.0))),
                      ("phi3.attention.sliding_window", int(config.get("sliding_window") or 0))]
    long, short = rope.get("long_factor"), rope.get("short_factor")
    if not long:
        return meta, []
    kind = str(rope.get("rope_type") or "").lower()
    scale = n["context"] / original
    if kind in ("su", "longrope"):
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        attn_factor = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise FamilyError(f"Phi-3 rope factors with rope_type {kind!r} (llama.cpp reads su, longrope, yarn)")
    if not short or len(long) != len(short) or len(long) != rope_dims / 2:
        raise FamilyError(f"Phi-3 rope factors: long {len(long)}, short {len(short or [])}, want {rope_dims // 2} each")
    meta.append(("phi3.rope.scaling.attn_factor", attn_factor))
    return meta, [("rope_factors_long.weight", np.asarray(long, np.float32)),
                  ("rope_factors_short.weight", np.asarray(short, np.float32))]


def gemma(config: dict[str, Any], n: dict[str, int], eps: float) -> Metadata:
    """Gemma (1, CodeGemma): the common keys and the head size; no soft-caps, no sliding window."""
    return [*_common("gemma", config, n, eps),
            ("gemma.attention.key_length", n["head_dim"]), ("gemma.attention.value_length", n["head_dim"])]


def granite(config: dict[str, Any]) -> Metadata:
    """Granite's multipliers, under llama.cpp's names, each only when set (as its converter writes them)."""
    keys = (("attention_multiplier", "granite.attention.scale"), ("embedding_multiplier", "granite.embedding_scale"),
            ("residual_multiplier", "granite.residual_scale"), ("logits_scaling", "granite.logit_scale"))
    return [(key, float(config[hf])) for hf, key in keys if config.get(hf)]


def gemma2(config: dict[str, Any], n: dict[str, int], eps: float) -> Metadata:
    """Gemma 2: head size, both soft-caps and the sliding window (llama.cpp fixes the pattern and rope base)."""
    return [*_common("gemma2", config, n, eps),
            ("gemma2.attention.key_length", n["head_dim"]), ("gemma2.attention.value_length", n["head_dim"]),
            ("gemma2.attn_logit_softcapping", float(config["attn_logit_softcapping"])),
            ("gemma2.final_logit_softcapping", float(config["final_logit_softcapping"])),
            ("gemma2.attention.sliding_window", int(config["sliding_window"]))]


def gemma3(config: dict[str, Any], n: dict[str, int], eps: float) -> Metadata:
    """Gemma 3 (text): head size, global and local rope bases, optional final soft-cap, sliding window."""
    if config.get("attn_logit_softcapping") is not None:
        raise FamilyError("Gemma 3 with attn_logit_softcapping (llama.cpp's converter refuses it)")
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope = rope_params(config)
    meta = _common("gemma3", config, n, eps)
    kind = rope.get("rope_type")
    if kind == "linear" and rope.get("factor") is not None:
        meta += [("gemma3.rope.scaling.type", "linear"), ("gemma3.rope.scaling.factor", float(rope["factor"]))]
    elif kind not in (None, "default"):
        raise FamilyError(f"Gemma 3 rope_type {kind!r} (mreg writes default and linear)")
    meta.append(("gemma3.rope.freq_base", float(rope.get("rope_theta", 1_000_000.0))))
    local = (params.get("sliding_attention") or {}).get("rope_theta", config.get("rope_local_base_freq"))
    if local is not None:
        meta.append(("gemma3.rope.freq_base_swa", float(local)))
    meta += [("gemma3.attention.key_length", n["head_dim"]), ("gemma3.attention.value_length", n["head_dim"])]
    if config.get("final_logit_softcapping"):
        meta.append(("gemma3.final_logit_softcapping", float(config["final_logit_softcapping"])))
    if config.get("sliding_window_pattern") != 1:
        meta.append(("gemma3.attention.sliding_window", int(config["sliding_window"])))
    return meta
