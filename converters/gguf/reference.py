"""mreg's own float32 forward pass of a Hugging Face causal LM, streamed from its safetensors files.

GGUF verification compares llama.cpp's logits with these. transformers would hold the whole model
in float32 (4 bytes a parameter); here each weight matrix is read a block of rows at a time into
buffers each worker thread reuses, widened to float32 and multiplied, so resident memory is the
activations plus two blocks a thread whatever the model size. Blocks run in a thread pool (pread,
numpy's widening and matmul release the GIL), so BLAS itself should run one thread
(OPENBLAS_NUM_THREADS=1: two levels of threads on the same cores make OpenBLAS many times slower).
The arithmetic is that of transformers' Llama, Mistral, Qwen2, Qwen3, Phi3, Gemma2 and Gemma3 (text)
modules in float32, and the tests hold the two equal to float32 rounding.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from converters.gguf.model import (
    DTYPES,
    SafetensorsReader,
    SourceTensor,
    load_weights,
    pread_exact,
    rope_settings,
    widen,
)
from converters.gguf.quants.blocks import Floats
from registry.errors import MregError

#: float32 elements of one weight block (4 MB): large enough that per-block overhead vanishes, small in memory.
BLOCK_ELEMENTS = 1 << 20
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
                 "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Qwen3MoeForCausalLM",
                 "GraniteForCausalLM", "Olmo2ForCausalLM",
                 "MixtralForCausalLM", "Qwen2MoeForCausalLM")
#: Gemma's conventions: norms multiply by (1 + weight), embeddings by sqrt(hidden), gelu-tanh.
_GEMMA = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
#: Gemma 2 and 3 add sandwich norms, per-layer sliding windows and a query scale of their own.
_SANDWICH = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


class ReferenceUnsupported(MregError):
    """The source uses something this forward pass does not implement: its logits cannot be compared."""


@dataclass(frozen=True)
class Hyperparameters:
    """What the forward pass needs from config.json."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    qk_norm: bool
    tied: bool
    window: int | None
    inv_freq: Floats
    rope_gain: float
    #: Phi-3: one qkv_proj and one gate_up_proj matrix per layer.
    fused: bool = False
    #: Gemma: norms multiply by (1 + weight), embeddings by sqrt(hidden).
    gemma: bool = False
    #: Gemma 2/3: a norm after attention and after the MLP too.
    sandwich: bool = False
    act: str = "silu"
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    #: Per layer: whether it attends within the sliding window (Gemma alternates), and their own rope.
    sliding: tuple[bool, ...] = ()
    local_rope: tuple[Floats, float] | None = None
    #: OLMo 2: no norm before attention or the MLP, one after each (before the residual add); q/k norms over
    #: every head at once.
    post_norms: bool = False
    #: Granite: embeddings multiplied, each residual branch multiplied, logits divided.
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logits_divisor: float = 1.0
    #: A mixture of experts in every layer: how many, how many each token takes, whether their weights sum to 1.
    experts: int = 0
    experts_used: int = 0
    norm_topk: bool = True
    #: Where a layer's mixture lives and its experts' gate, up and down matrices (Qwen's names, Mixtral's).
    moe_names: tuple[str, str, str, str] = ("mlp.", "gate_proj", "up_proj", "down_proj")


def _llama3_inv_freq(inv: Floats, rope: dict[str, Any], max_pos: int) -> Floats:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, a smooth ramp between."""
    factor = np.float32(rope["factor"])
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings") or max_pos)
    wavelen = np.float32(2 * math.pi) / inv
    smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
    ramp = (1 - smooth) * inv / factor + smooth * inv
    out = np.where(wavelen > old / low, inv / factor, np.where(wavelen < old / high, inv, ramp))
    return out.astype(np.float32)


def _yarn_inv_freq(inv: Floats, rope: dict[str, Any], dim: int, base: float, max_pos: int) -> tuple[Floats, float]:
    """YaRN: interpolated and extrapolated frequencies blended over a ramp of dimensions, and its cos/sin gain."""
    old = float(rope.get("original_max_position_embeddings") or max_pos)
    factor = float(rope.get("factor") or max_pos / old)

    def gain(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = rope.get("attention_factor")
    if attention is None:
        attention = gain(factor, mscale) / gain(factor, mscale_all) if mscale and mscale_all else gain(factor)

    def dim_of(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(rope.get("beta_fast") or 32), dim_of(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    hi = hi + 0.001 if hi == lo else hi
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(np.float32)
    keep = 1 - ramp
    out = (inv / np.float32(factor)) * (1 - keep) + inv * keep
    return out.astype(np.float32), float(attention)


def _rope(config: dict[str, Any], head_dim: int, n: int = 0, theta: float | None = None) -> tuple[Floats, float]:
    """Inverse frequencies of the rotary embedding (of its rotated dimensions only: partial rotary), and the gain
    on its cos/sin, from the rope settings; `theta` overrides the base (Gemma 3's local layers)."""
    base_theta, kind, rope = rope_settings(config)
    if theta is not None:
        base_theta, kind, rope = theta, "default", {}
    base = base_theta if base_theta is not None else 10000.0
    partial = float(rope.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0)
    dim = int(head_dim * partial)
    if dim % 2 or dim <= 0:
        raise ReferenceUnsupported(f"a rotary dimension of {dim}")
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv = (np.float32(1.0) / np.float32(base) ** exponents).astype(np.float32)
    max_pos = int(config.get("max_position_embeddings", 4096))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return (inv / np.float32(rope["factor"])).astype(np.float32), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv, rope, max_pos), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(inv, rope, dim, base, max_pos)
    if kind == "longrope":
        return _longrope_inv_freq(exponents, rope, base, max_pos, n)
    raise ReferenceUnsupported(f"rope_scaling type {kind!r} is not implemented")


def _longrope_inv_freq(exponents: Floats, rope: dict[str, Any], base: float, max_pos: int,
                       n: int) -> tuple[Floats, float]:
    """Phi-3's LongRoPE: per-pair divisors, the long ones past the original context; a gain from the extension."""
    old = int(rope.get("original_max_position_embeddings") or max_pos)
    factor = float(rope.get("factor") or max_pos / old)
    gain = rope.get("attention_factor")
    if gain is None:
        gain = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    ext = np.asarray(rope["long_factor"] if n > old else rope["short_factor"], np.float32)
    if ext.shape != exponents.shape:
        raise ReferenceUnsupported(f"{ext.size} longrope factors for {exponents.size} rotary pairs")
    return (np.float32(1.0) / (ext * np.float32(base) ** exponents)).astype(np.float32), float(gain)


def _window(config: dict[str, Any], arch: str, n: int) -> int | None:
    """The sliding window to apply, None when it cannot matter for n tokens."""
    window = config.get("sliding_window")
    if not window or n <= int(window):
        return None
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        return int(window)
    if config.get("use_sliding_window"):
        raise ReferenceUnsupported(f"a sliding window of {window} on some layers, with {n} tokens")
    return None


def _granite(config: dict[str, Any], key: str, default: float | None) -> Any:
    """One of Granite's multipliers; unset or 0 is the default (llama.cpp's converter writes only those set)."""
    return float(config[key]) if config.get(key) else default


def _sliding_layers(config: dict[str, Any], arch: str, layers: int) -> tuple[bool, ...]:
    """Which layers attend within the sliding window: Gemma's layer_types (or its every-second / every-sixth
    pattern), Phi-3's and Mistral's all of them."""
    if arch not in _SANDWICH:
        return ()
    types = config.get("layer_types")
    if types:
        return tuple(t == "sliding_attention" for t in types)
    pattern = 2 if arch == "Gemma2ForCausalLM" else int(config.get("sliding_window_pattern") or 6)
    return tuple(bool((i + 1) % pattern) for i in range(layers))


def _moe(config: dict[str, Any], arch: str, layers: int) -> dict[str, Any]:
    """Qwen3-MoE's routing settings; a mixture with dense layers among its sparse ones is not implemented."""
    if arch == "MixtralForCausalLM":  # Mixtral always renormalizes over the chosen experts
        return {"experts": int(config["num_local_experts"]), "experts_used": int(config["num_experts_per_tok"]),
                "norm_topk": True, "moe_names": ("block_sparse_moe.", "w1", "w3", "w2")}
    if arch not in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        return {}
    step = int(config.get("decoder_sparse_step") or 1)
    dense = [i for i in range(layers) if i in (config.get("mlp_only_layers") or []) or (i + 1) % step]
    if dense:
        raise ReferenceUnsupported(f"dense layers {dense[:5]} in a mixture of experts")
    return {"experts": int(config.get("num_experts") or config["num_local_experts"]),
            "experts_used": int(config["num_experts_per_tok"]),
            "norm_topk": bool(config.get("norm_topk_prob", arch == "Qwen3MoeForCausalLM"))}


def _experts(w: _Weights, s: Hyperparameters, pre: str, h: Floats) -> Floats:
    """A softmax router picks each token's top experts; their SwiGLU outputs are summed, weighted by its
    probabilities (renormalized over the chosen ones when norm_topk_prob); experts stream one at a time."""
    block, gate_name, up_name, down_name = s.moe_names
    (logits,) = w.linear(h, pre + block + "gate")
    probs = softmax(logits.astype(np.float32))
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :s.experts_used]
    weights = np.take_along_axis(probs, top, axis=-1)
    if s.norm_topk:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for e in range(s.experts):
        tokens, slot = np.nonzero(top == e)
        if tokens.size == 0:
            continue
        name = f"{pre}{block}experts.{e}."
        gate, up = w.linear(h[tokens], name + gate_name, name + up_name)
        (down,) = w.linear(_silu(gate) * up, name + down_name)
        np.add.at(out, tokens, down * weights[tokens, slot][:, None])
    shared = f"{pre}mlp.shared_expert."
    if shared + "gate_proj.weight" in w:  # Qwen2-MoE: an expert every token takes, behind a sigmoid gate
        gate, up = w.linear(h, shared + "gate_proj", shared + "up_proj")
        (down,) = w.linear(_silu(gate) * up, shared + "down_proj")
        (g,) = w.linear(h, pre + "mlp.shared_expert_gate")
        out = out + down / (1 + np.exp(-g))
    return out


def _hyperparameters(config: dict[str, Any], n: int) -> Hyperparameters:
    """The forward pass's view of config.json for an n-token prompt, or ReferenceUnsupported."""
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise ReferenceUnsupported(f"architecture {arch} is not implemented")
    gemma = arch in _GEMMA
    # Gemma's configs may leave hidden_activation null: transformers then takes gelu-tanh, as llama.cpp does.
    act = (config.get("hidden_activation") or "gelu_pytorch_tanh") if gemma else config.get("hidden_act", "silu")
    if act not in ("silu", "gelu_pytorch_tanh"):
        raise ReferenceUnsupported(f"hidden_act {act!r} is not implemented (only silu and gelu_pytorch_tanh)")
    try:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        inv_freq, gain = _rope(config, head_dim, n)
        layers = int(config["num_hidden_layers"])
        local = None
        if arch == "Gemma3ForCausalLM":
            params = config.get("rope_parameters") or {}
            theta = (params.get("sliding_attention") or {}).get("rope_theta", config.get("rope_local_base_freq"))
            local = _rope(config, head_dim, n, theta=float(theta or 10000.0))
            full = params.get("full_attention")
            if full:
                inv_freq, gain = _rope({**config, "rope_parameters": full}, head_dim, n)
        window = config.get("sliding_window")
        return Hyperparameters(
            layers=layers,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            eps=float(config.get("rms_norm_eps", 1e-6)),
            tied=bool(config.get("tie_word_embeddings", gemma)),
            window=int(window) if gemma and window and n > int(window) else _window(config, arch, n),
            inv_freq=inv_freq,
            rope_gain=gain,
            fused=arch == "Phi3ForCausalLM",
            gemma=gemma,
            sandwich=arch in _SANDWICH,
            act=str(act),
            attn_scale=(float(config["query_pre_attn_scalar"]) ** -0.5 if arch in _SANDWICH
                        else _granite(config, "attention_multiplier", None) if arch == "GraniteForCausalLM" else None),
            attn_softcap=config.get("attn_logit_softcapping") if gemma else None,
            final_softcap=config.get("final_logit_softcapping") if gemma else None,
            sliding=_sliding_layers(config, arch, layers),
            **({"embedding_scale": _granite(config, "embedding_multiplier", 1.0),
                "residual_scale": _granite(config, "residual_multiplier", 1.0),
                "logits_divisor": _granite(config, "logits_scaling", 1.0)} if arch == "GraniteForCausalLM" else {}),
            local_rope=local,
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Qwen3MoeForCausalLM", "Olmo2ForCausalLM"),
            post_norms=arch == "Olmo2ForCausalLM",
            **_moe(config, arch, layers),
        )
    except KeyError as e:
        raise ReferenceUnsupported(f"config.json lacks {e.args[0]}") from e


class _Weights:
    """The checkpoint's tensors by name, multiplied a block of rows at a time on a thread pool.

    Blocks are read with pread into buffers each thread reuses, not through a memory map: a map's
    pages stay resident until released, and the kernel maps more around each fault than was asked.
    """

    def __init__(self, directory: Path, pool: ThreadPoolExecutor) -> None:
        self.tensors = load_weights(sorted(directory.rglob("*.safetensors")))
        odd = sorted({t.dtype for t in self.tensors.values() if t.dtype not in DTYPES})
        if odd:
            raise ReferenceUnsupported(f"weights of dtype {', '.join(odd)}")
        self.files = SafetensorsReader()  # one descriptor per shard
        self.pool = pool
        self.local = threading.local()
        #: Called with each matrix's name and its input before it is multiplied (importance matrices).
        self.observe: Callable[[str, Floats], None] | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def _tensor(self, name: str) -> SourceTensor:
        if name not in self.tensors:
            raise ReferenceUnsupported(f"the checkpoint has no tensor {name}")
        return self.tensors[name]

    def _buffer(self, name: str, count: int, dtype: type[np.generic]) -> npt.NDArray[Any]:
        """This thread's reusable buffer of at least count elements: no allocation per block."""
        buf: npt.NDArray[Any] | None = getattr(self.local, name, None)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, BLOCK_ELEMENTS), dtype)
            setattr(self.local, name, buf)
        return buf[:count]

    def _read(self, t: SourceTensor, start: int, stop: int, out: Floats) -> Floats:
        """Rows [start, stop) of t (2-D view) as float32 into out, through this thread's staging buffer."""
        cols = t.shape[-1]
        count = (stop - start) * cols
        offset = t.offset + start * cols * DTYPES[t.dtype].itemsize
        out = out[:count]
        fd = self.files.fd(t.path)
        if t.dtype == "F32":
            pread_exact(fd, out, offset)
            return out.reshape(-1, cols)
        raw = self._buffer("raw", count, np.uint16).view(DTYPES[t.dtype])
        pread_exact(fd, raw, offset)
        return widen(raw, t.dtype, out).reshape(-1, cols)

    def vector(self, name: str) -> Floats:
        """A small tensor (norm weight, bias) whole."""
        t = self._tensor(name)
        return self._read(t, 0, math.prod(t.shape[:-1]), np.empty(math.prod(t.shape), np.float32)).reshape(t.shape)

    def rows(self, name: str, indices: Sequence[int]) -> Floats:
        """Chosen rows of a matrix (the embeddings of some token ids)."""
        t = self._tensor(name)
        bad = [i for i in indices if not 0 <= i < t.shape[0]]
        if bad:
            raise ReferenceUnsupported(f"token ids {bad[:5]} are outside {name}'s {t.shape[0]} rows")
        return np.concatenate([self._read(t, i, i + 1, np.empty(t.shape[1], np.float32)) for i in indices])

    def linear(self, x: Floats, *names: str) -> list[Floats]:
        """x @ W.T (+ bias) for each named matrix, W streamed in row blocks spread over the pool."""
        if self.observe is not None:
            for n in names:
                self.observe(n + ".weight", x)
        xt = np.ascontiguousarray(x.T)
        mats = [self._tensor(n + ".weight") for n in names]
        # Transposed outputs: each block's product lands in contiguous rows, written in place.
        outs = [np.empty((t.shape[0], x.shape[0]), np.float32) for t in mats]
        jobs = []
        for out, t in zip(outs, mats, strict=True):
            step = max(1, BLOCK_ELEMENTS // t.shape[1])
            jobs += [(out, t, a, min(a + step, t.shape[0])) for a in range(0, t.shape[0], step)]

        def run(job: tuple[Floats, SourceTensor, int, int]) -> None:
            out, t, a, b = job
            block = self._buffer("block", (b - a) * t.shape[1], np.float32)
            out[a:b] = self._read(t, a, b, block) @ xt

        for _ in self.pool.map(run, jobs):
            pass
        results = [np.ascontiguousarray(out.T) for out in outs]
        for out, name in zip(results, names, strict=True):
            if name + ".bias" in self:
                out += self.vector(name + ".bias")
        return results

    def close(self) -> None:
        """Close every file."""
        self.files.close()


def _rms_norm(x: Floats, weight: Floats, eps: float) -> Floats:
    scale = np.float32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    out: Floats = weight * (x * scale)
    return out


def _rotate(x: Floats, cos: Floats, sin: Floats) -> Floats:
    """Rotary embedding, HF layout: each head's first half pairs with its second half (of the rotated
    dimensions; the rest pass through, as with Phi-3's partial rotary)."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    turned: Floats = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    out: Floats = rot * cos[:, None, :] + turned * sin[:, None, :]
    if rest.shape[-1]:
        out = np.concatenate([out, rest], axis=-1)
    return out


def softmax(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Softmax over the last axis, in x's precision."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: npt.NDArray[Any] = e / e.sum(axis=-1, keepdims=True)
    return out


def _attention(q: Floats, k: Floats, v: Floats, mask: Floats, scale: float | None = None,
               softcap: float | None = None) -> Floats:
    """Causal attention for (tokens, heads, head_dim) q and (tokens, kv_heads, head_dim) k, v; Gemma's own
    query scale and score soft-cap (`tanh(s / cap) * cap`) when given."""
    n, heads, dim = q.shape
    kv = k.shape[1]
    # Query heads h*g .. h*g+g-1 share key/value head h.
    qg = q.reshape(n, kv, heads // kv, dim).transpose(1, 2, 0, 3)
    kt = k.transpose(1, 2, 0)[:, None]
    scores = (qg @ kt) * np.float32(dim**-0.5 if scale is None else scale)
    if softcap:
        scores = np.tanh(scores / np.float32(softcap)) * np.float32(softcap)
    scores = scores + mask
    out = softmax(scores) @ v.transpose(1, 0, 2)[:, None]
    result: Floats = out.transpose(2, 0, 1, 3).reshape(n, heads * dim)
    return result


def _silu(x: Floats) -> Floats:
    with np.errstate(over="ignore"):
        denominator: Floats = 1 + np.exp(-x)
    out: Floats = x / denominator
    return out


def _gelu_tanh(x: Floats) -> Floats:
    inner = np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x**3)
    out: Floats = x * np.float32(0.5) * (1 + np.tanh(inner))
    return out


def _norm(w: _Weights, s: Hyperparameters, x: Floats, name: str) -> Floats:
    """RMSNorm; Gemma's multiplies by (1 + weight)."""
    weight = w.vector(name)
    return _rms_norm(x, weight + np.float32(1.0) if s.gemma else weight, s.eps)


Rope = tuple[Floats, Floats, Floats]


def _layer(w: _Weights, s: Hyperparameters, i: int, x: Floats, rope: Rope) -> Floats:
    """One decoder layer: pre-norm attention then a pre-norm gated MLP, each added to the residual (Gemma
    2 and 3 normalize each output again before adding it, Granite multiplies it first)."""
    pre = f"model.layers.{i}."
    n = x.shape[0]
    cos, sin, mask = rope
    h = x if s.post_norms else _norm(w, s, x, pre + "input_layernorm.weight")
    if s.fused:
        (qkv,) = w.linear(h, pre + "self_attn.qkv_proj")
        q_rows, kv_rows = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q, k, v = qkv[:, :q_rows], qkv[:, q_rows:q_rows + kv_rows], qkv[:, q_rows + kv_rows:]
    else:
        q, k, v = w.linear(h, pre + "self_attn.q_proj", pre + "self_attn.k_proj", pre + "self_attn.v_proj")
    if s.qk_norm and s.post_norms:
        q = _norm(w, s, q, pre + "self_attn.q_norm.weight")
        k = _norm(w, s, k, pre + "self_attn.k_norm.weight")
    q, k, v = (t.reshape(n, -1, s.head_dim) for t in (q, k, v))
    if s.qk_norm and not s.post_norms:
        q = _norm(w, s, q, pre + "self_attn.q_norm.weight")
        k = _norm(w, s, k, pre + "self_attn.k_norm.weight")
    a = _attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, mask, s.attn_scale, s.attn_softcap)
    a = w.linear(a, pre + "self_attn.o_proj")[0]
    if s.sandwich or s.post_norms:
        a = _norm(w, s, a, pre + "post_attention_layernorm.weight")
    x = x + a * np.float32(s.residual_scale)  # 1 (all but Granite) multiplies exactly
    if s.post_norms:
        h = x
    else:
        h = _norm(w, s, x, pre + ("pre_feedforward_layernorm.weight" if s.sandwich else
                                  "post_attention_layernorm.weight"))
    if s.experts:
        return x + _experts(w, s, pre, h)
    out: Floats = x + _mlp(w, s, pre, h) * np.float32(s.residual_scale)
    return out


def _mlp(w: _Weights, s: Hyperparameters, pre: str, h: Floats) -> Floats:
    """The gated MLP of one layer (Gemma 2/3: normalized again)."""
    if s.fused:
        (gate_up,) = w.linear(h, pre + "mlp.gate_up_proj")
        gate, up = np.split(gate_up, 2, axis=-1)
    else:
        gate, up = w.linear(h, pre + "mlp.gate_proj", pre + "mlp.up_proj")
    act = _gelu_tanh(gate) if s.act == "gelu_pytorch_tanh" else _silu(gate)
    m: Floats = w.linear(act * up, pre + "mlp.down_proj")[0]
    if s.sandwich or s.post_norms:
        m = _norm(w, s, m, pre + "post_feedforward_layernorm.weight")
    return m


def _positions(s: Hyperparameters, n: int, inv_freq: Floats, gain: float, window: int | None) -> Rope:
    """cos and sin of the rotary angles for positions 0..n-1, and the additive causal mask."""
    angles = np.arange(n, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    g = np.float32(gain)
    cos, sin = (np.cos(angles) * g).astype(np.float32), (np.sin(angles) * g).astype(np.float32)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    if window is not None:
        mask += np.tril(np.full((n, n), -np.inf, np.float32), -window)
    return cos, sin, mask


def reference_logits(directory: Path, ids: list[int], workers: int | None = None) -> Floats:
    """float32 logits (len(ids), vocab) of the causal LM in `directory` on one unpadded sequence.

    The blocks run on `workers` threads: the caller should hold BLAS to one thread of its own
    (OPENBLAS_NUM_THREADS=1, as the verification child's environment does), or it is many times slower.
    """
    (logits,) = forward(directory, [ids], workers)
    return logits


def forward(directory: Path, sequences: Iterable[list[int]], workers: int | None = None,
            observe: Callable[[str, Floats], None] | None = None, head: bool = True) -> list[Floats]:
    """The forward pass of each sequence in turn, on one opening of the weights; `observe` sees every matrix's
    input (its name in the checkpoint, the activations); without `head`, no logits are computed (an empty list)."""
    config = json.loads((directory / "config.json").read_text())
    out: list[Floats] = []
    with ThreadPoolExecutor(max(1, workers or os.cpu_count() or 1)) as pool:
        w: _Weights | None = None
        try:
            for ids in sequences:
                s = _hyperparameters(config, len(ids))
                if w is None:
                    w = _Weights(directory, pool)
                    w.observe = observe
                logits = _sequence(w, s, ids, head)
                if head:
                    out.append(logits)
        finally:
            if w is not None:
                w.close()
    return out


def _sequence(w: _Weights, s: Hyperparameters, ids: list[int], head: bool) -> Floats:
    """One sequence through every layer, one layer at a time; its logits when `head`, else its final states."""
    x = w.rows("model.embed_tokens.weight", ids)
    if s.gemma:
        x = x * np.float32(math.sqrt(x.shape[-1]))
    if s.embedding_scale != 1.0:
        x = x * np.float32(s.embedding_scale)
    n = len(ids)
    if s.gemma:  # the window only on the sliding layers; Gemma 3's have their own rope base
        local = s.local_rope or (s.inv_freq, s.rope_gain)
        ropes = {True: _positions(s, n, *local, s.window),
                 False: _positions(s, n, s.inv_freq, s.rope_gain, None)}
        layer_ropes = [ropes[i < len(s.sliding) and s.sliding[i]] for i in range(s.layers)]
    else:
        layer_ropes = [_positions(s, n, s.inv_freq, s.rope_gain, s.window)] * s.layers
    for i in range(s.layers):
        x = _layer(w, s, i, x, layer_ropes[i])
    if not head:
        return x
    x = _norm(w, s, x, "model.norm.weight")
    name = "model.embed_tokens" if s.tied or "lm_head.weight" not in w else "lm_head"
    observe, w.observe = w.observe, None  # the output matrix is not part of an importance matrix (llama-imatrix's)
    try:
        logits = w.linear(x, name)[0]
    finally:
        w.observe = observe
    if s.final_softcap:
        logits = np.tanh(logits / np.float32(s.final_softcap)) * np.float32(s.final_softcap)
    if s.logits_divisor != 1.0:
        logits = logits / np.float32(s.logits_divisor)
    return logits
