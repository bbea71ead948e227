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


def _layer_kinds(text: dict[str, Any], layers: int, notes: list[str]) -> tuple[dict[str, int], int | None]:
    """How many layers are `full`, `window` or `none`, and the window (tokens) of the `window` ones.

    Counted by arithmetic, never by a list per layer: `num_hidden_layers` is a number from the config, and a
    config that says 10**9 must cost no memory (a list of layer kinds took 7.9 GB before it was published).
    """
    window = _int(text, "sliding_window", "attention_chunk_size")
    kinds_in = text.get("layer_types")
    mtype = str(text.get("model_type", ""))
    if isinstance(kinds_in, list) and len(kinds_in) == layers and all(isinstance(k, str) for k in kinds_in):
        # The list is the config's own (its length bounded by the file), not one made from a number.
        full, windowed = sum(k in FULL for k in kinds_in), sum(k in WINDOW for k in kinds_in)
        counts = {"full": full, "window": windowed, "none": layers - full - windowed}
        if "chunked_attention" in kinds_in:
            window = _int(text, "attention_chunk_size") or window
            notes.append("chunked-attention layers counted as windows of attention_chunk_size tokens")
    elif _int(text, "full_attention_interval") or "linear_num_value_heads" in text:
        # Qwen3-Next / Qwen3.5: one full-attention layer every `full_attention_interval` (transformers' default 4)
        every = _int(text, "full_attention_interval") or 4
        counts = {"full": layers // every, "window": 0, "none": layers - layers // every}
    elif mtype.startswith("gemma2"):  # even layers slide, odd ones attend fully
        counts = {"full": layers // 2, "window": layers - layers // 2, "none": 0}
    elif mtype.startswith("gemma3"):  # every `sliding_window_pattern`-th layer attends fully
        pattern = _int(text, "sliding_window_pattern") or 6
        counts = {"full": layers // pattern, "window": layers - layers // pattern, "none": 0}
    elif text.get("use_sliding_window") is False or window is None:
        counts = {"full": layers, "window": 0, "none": 0}
    elif "max_window_layers" in text and isinstance(text.get("max_window_layers"), int):
        first = min(max(int(text["max_window_layers"]), 0), layers)  # layers from `first` on slide
        counts = {"full": first, "window": layers - first, "none": 0}
    else:
        counts = {"full": 0, "window": layers, "none": 0}  # Mistral: every layer slides
    if counts["window"] and window is None:
        counts = {**counts, "full": counts["full"] + counts["window"], "window": 0}
        notes.append("sliding-window layers without a window size counted as full attention")
    if counts["none"]:
        notes.append(f"{counts['none']} linear-attention or state-space layers hold a fixed-size state, "
                     "not counted per token")
    return counts, window


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
    counts, window = _layer_kinds(text, layers, notes)
    full, windowed = counts["full"], counts["window"]

    def per_token(count: int) -> dict[str, int]:
        return {d: math.ceil(count * elements * b) for d, b in DTYPE_BYTES.items()} if count else {}

    return KVCache(
        bytes_per_token=per_token(full) or dict.fromkeys(DTYPE_BYTES, 0),
        window_bytes_per_token=per_token(windowed),
        sliding_window=window if windowed else None,
        layers=layers, full_layers=full, window_layers=windowed, uncached_layers=counts["none"],
        attention=attention,
        kv_heads=kv_heads if attention == "mha" else 1, head_dim=head_dim if attention == "mha" else elements,
        notes=tuple(notes),
    )
