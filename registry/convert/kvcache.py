"""KV-cache bytes per token of a decoder, from its config.json alone (no weights are opened).

Per layer and token, standard attention caches K and V for every KV head: `kv_heads × head_dim × 2`
elements; MLA (DeepSeek V2/V3, Kimi) caches one compressed latent and the rope key: `kv_lora_rank +
qk_rope_head_dim` elements. Elements cost 2 bytes in f16, 34/32 in q8_0 (a block of 32 int8 and an f16
scale) and 18/32 in q4_0 (32 nibbles and an f16 scale), rounded up to a whole byte per token.

Layers are told apart by `layer_types` where the config has it, else by each family's own rule:
sliding-window layers (Mistral's `sliding_window`, Gemma 2's every other layer, Gemma 3's
`sliding_window_pattern`, Qwen2's `max_window_layers` under `use_sliding_window`) cache at most the
window; linear-attention layers (Qwen3-Next / Qwen3.5 `full_attention_interval`, state-space
layers) hold a fixed state and no per-token cache: they are counted as `uncached_layers`, not in bytes.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

from manifests import KVCache

#: Bytes per cached element of each llama.cpp cache type (vLLM's `auto` on a 16-bit model is f16's).
DTYPE_BYTES = {"f16": Fraction(2), "q8_0": Fraction(34, 32), "q4_0": Fraction(18, 32)}
#: Layer types that cache every token, and those that cache a window of them.
FULL = ("full_attention", "attention", "global")
WINDOW = ("sliding_attention", "chunked_attention", "local", "sliding")
DECODER_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _layer_kinds(text: dict[str, Any], layers: int, notes: list[str]) -> tuple[list[str], int | None]:
    """Each layer as `full`, `window` or `none`, and the window (tokens) of the `window` ones."""
    window = _int(text, "sliding_window", "attention_chunk_size")
    kinds_in = text.get("layer_types")
    mtype = str(text.get("model_type", ""))
    if isinstance(kinds_in, list) and len(kinds_in) == layers and all(isinstance(k, str) for k in kinds_in):
        kinds = ["full" if k in FULL else "window" if k in WINDOW else "none" for k in kinds_in]
        if "chunked_attention" in kinds_in:
            window = _int(text, "attention_chunk_size") or window
            notes.append("chunked-attention layers counted as windows of attention_chunk_size tokens")
    elif _int(text, "full_attention_interval") or "linear_num_value_heads" in text:
        # Qwen3-Next / Qwen3.5: one full-attention layer every `full_attention_interval` (transformers' default 4)
        every = _int(text, "full_attention_interval") or 4
        kinds = ["full" if (i + 1) % every == 0 else "none" for i in range(layers)]
    elif mtype.startswith("gemma2"):
        kinds = ["window" if i % 2 == 0 else "full" for i in range(layers)]
    elif mtype.startswith("gemma3"):
        pattern = _int(text, "sliding_window_pattern") or 6
        kinds = ["window" if (i + 1) % pattern else "full" for i in range(layers)]
    elif text.get("use_sliding_window") is False or window is None:
        kinds = ["full"] * layers
    elif "max_window_layers" in text and isinstance(text.get("max_window_layers"), int):
        first = int(text["max_window_layers"])
        kinds = ["window" if i >= first else "full" for i in range(layers)]
    else:
        kinds = ["window"] * layers  # Mistral: every layer slides
    if "window" in kinds and window is None:
        kinds = ["full" if k == "window" else k for k in kinds]
        notes.append("sliding-window layers without a window size counted as full attention")
    if "none" in kinds:
        notes.append(f"{kinds.count('none')} linear-attention or state-space layers hold a fixed-size state, "
                     "not counted per token")
    return kinds, window


def kv_cache_of(config: dict[str, Any]) -> KVCache | None:
    """The KV-cache figures of a decoder's config.json, or None (an encoder, or a config without the sizes)."""
    archs = config.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0].endswith(DECODER_SUFFIXES)):
        return None
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    layers = _int(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(text, "num_attention_heads", "n_head")
    hidden = _int(text, "hidden_size", "n_embd")
    if layers is None or heads is None:
        return None
    kv_heads = _int(text, "num_key_value_heads", "n_head_kv") or heads
    head_dim = _int(text, "head_dim") or (hidden // heads if hidden else 0)
    notes: list[str] = []
    lora, rope = _int(text, "kv_lora_rank"), _int(text, "qk_rope_head_dim")
    attention: Literal["mha", "mla"]
    if lora is not None:
        elements = lora + (rope or 0)
        attention = "mla"
        notes.append("MLA: one latent (kv_lora_rank + qk_rope_head_dim) per layer and token, as vLLM and "
                     "llama.cpp's MLA path cache it; an engine that expands K and V needs far more")
    else:
        if not head_dim:
            return None
        elements = kv_heads * head_dim * 2
        attention = "mha"
    kinds, window = _layer_kinds(text, layers, notes)
    full, windowed = kinds.count("full"), kinds.count("window")

    def per_token(count: int) -> dict[str, int]:
        return {d: math.ceil(count * elements * b) for d, b in DTYPE_BYTES.items()} if count else {}

    return KVCache(
        bytes_per_token=per_token(full) or dict.fromkeys(DTYPE_BYTES, 0),
        window_bytes_per_token=per_token(windowed),
        sliding_window=window if windowed else None,
        layers=layers, full_layers=full, window_layers=windowed, uncached_layers=kinds.count("none"),
        attention=attention,
        kv_heads=kv_heads if attention == "mha" else 1, head_dim=head_dim if attention == "mha" else elements,
        notes=tuple(notes),
    )
