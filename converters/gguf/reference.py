"""mreg's own float32 forward pass of a Hugging Face causal LM, streamed from its safetensors files.

GGUF verification compares llama.cpp's logits with these. transformers would hold the whole model
in float32 (4 bytes a parameter); here each weight matrix is read a block of rows at a time into
buffers each worker thread reuses, widened to float32 and multiplied, so resident memory is the
activations plus two blocks a thread whatever the model size. Blocks run in a thread pool (pread,
numpy's widening and matmul release the GIL), so BLAS itself should run one thread
(OPENBLAS_NUM_THREADS=1: two levels of threads on the same cores make OpenBLAS many times slower).
The arithmetic is that of transformers' Llama, Mistral, Qwen2 and Qwen3 modules in float32, and the
tests hold the two equal to float32 rounding.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Sequence
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
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


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


def _rope(config: dict[str, Any], head_dim: int) -> tuple[Floats, float]:
    """Inverse frequencies of the rotary embedding, and the gain on its cos/sin, from the rope settings."""
    theta, kind, rope = rope_settings(config)
    base = theta if theta is not None else 10000.0
    if float(rope.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ReferenceUnsupported("partial rotary embeddings are not implemented")
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv = (np.float32(1.0) / np.float32(base) ** exponents).astype(np.float32)
    max_pos = int(config.get("max_position_embeddings", 4096))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return (inv / np.float32(rope["factor"])).astype(np.float32), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv, rope, max_pos), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(inv, rope, head_dim, base, max_pos)
    raise ReferenceUnsupported(f"rope_scaling type {kind!r} is not implemented")


def _window(config: dict[str, Any], arch: str, n: int) -> int | None:
    """The sliding window to apply, None when it cannot matter for n tokens."""
    window = config.get("sliding_window")
    if not window or n <= int(window):
        return None
    if arch == "MistralForCausalLM":
        return int(window)
    if config.get("use_sliding_window"):
        raise ReferenceUnsupported(f"a sliding window of {window} on some layers, with {n} tokens")
    return None


def _hyperparameters(config: dict[str, Any], n: int) -> Hyperparameters:
    """The forward pass's view of config.json for an n-token prompt, or ReferenceUnsupported."""
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise ReferenceUnsupported(f"architecture {arch} is not implemented")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ReferenceUnsupported(f"hidden_act {act!r} is not implemented (only silu)")
    try:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        inv_freq, gain = _rope(config, head_dim)
        return Hyperparameters(
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            eps=float(config.get("rms_norm_eps", 1e-6)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tied=bool(config.get("tie_word_embeddings", False)),
            window=_window(config, arch, n),
            inv_freq=inv_freq,
            rope_gain=gain,
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
    """Rotary embedding, HF layout: each head's first half pairs with its second half."""
    half = x.shape[-1] // 2
    turned: Floats = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out: Floats = x * cos[:, None, :] + turned * sin[:, None, :]
    return out


def softmax(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Softmax over the last axis, in x's precision."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: npt.NDArray[Any] = e / e.sum(axis=-1, keepdims=True)
    return out


def _attention(q: Floats, k: Floats, v: Floats, mask: Floats) -> Floats:
    """Causal attention for (tokens, heads, head_dim) q and (tokens, kv_heads, head_dim) k, v."""
    n, heads, dim = q.shape
    kv = k.shape[1]
    # Query heads h*g .. h*g+g-1 share key/value head h.
    qg = q.reshape(n, kv, heads // kv, dim).transpose(1, 2, 0, 3)
    kt = k.transpose(1, 2, 0)[:, None]
    scores = (qg @ kt) * np.float32(dim**-0.5) + mask
    out = softmax(scores) @ v.transpose(1, 0, 2)[:, None]
    result: Floats = out.transpose(2, 0, 1, 3).reshape(n, heads * dim)
    return result


def _silu(x: Floats) -> Floats:
    with np.errstate(over="ignore"):
        denominator: Floats = 1 + np.exp(-x)
    out: Floats = x / denominator
    return out


def _layer(w: _Weights, s: Hyperparameters, i: int, x: Floats, cos: Floats, sin: Floats, mask: Floats) -> Floats:
    """One decoder layer: pre-norm attention then pre-norm SwiGLU, each added to the residual."""
    pre = f"model.layers.{i}."
    n = x.shape[0]
    h = _rms_norm(x, w.vector(pre + "input_layernorm.weight"), s.eps)
    q, k, v = w.linear(h, pre + "self_attn.q_proj", pre + "self_attn.k_proj", pre + "self_attn.v_proj")
    q, k, v = (t.reshape(n, -1, s.head_dim) for t in (q, k, v))
    if s.qk_norm:
        q = _rms_norm(q, w.vector(pre + "self_attn.q_norm.weight"), s.eps)
        k = _rms_norm(k, w.vector(pre + "self_attn.k_norm.weight"), s.eps)
    a = _attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, mask)
    x = x + w.linear(a, pre + "self_attn.o_proj")[0]
    h = _rms_norm(x, w.vector(pre + "post_attention_layernorm.weight"), s.eps)
    gate, up = w.linear(h, pre + "mlp.gate_proj", pre + "mlp.up_proj")
    out: Floats = x + w.linear(_silu(gate) * up, pre + "mlp.down_proj")[0]
    return out


def _positions(s: Hyperparameters, n: int) -> tuple[Floats, Floats, Floats]:
    """cos and sin of the rotary angles for positions 0..n-1, and the additive causal mask."""
    angles = np.arange(n, dtype=np.float32)[:, None] * s.inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    gain = np.float32(s.rope_gain)
    cos, sin = (np.cos(angles) * gain).astype(np.float32), (np.sin(angles) * gain).astype(np.float32)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    if s.window is not None:
        mask += np.tril(np.full((n, n), -np.inf, np.float32), -s.window)
    return cos, sin, mask


def reference_logits(directory: Path, ids: list[int], workers: int | None = None) -> Floats:
    """float32 logits (len(ids), vocab) of the causal LM in `directory` on one unpadded sequence.

    The blocks run on `workers` threads: the caller should hold BLAS to one thread of its own
    (OPENBLAS_NUM_THREADS=1, as the verification child's environment does), or it is many times slower.
    """
    s = _hyperparameters(json.loads((directory / "config.json").read_text()), len(ids))
    with ThreadPoolExecutor(max(1, workers or os.cpu_count() or 1)) as pool:
        w = _Weights(directory, pool)
        try:
            x = w.rows("model.embed_tokens.weight", ids)
            cos, sin, mask = _positions(s, len(ids))
            for i in range(s.layers):
                x = _layer(w, s, i, x, cos, sin, mask)
            x = _rms_norm(x, w.vector("model.norm.weight"), s.eps)
            head = "model.embed_tokens" if s.tied or "lm_head.weight" not in w else "lm_head"
            return w.linear(x, head)[0]
        finally:
            w.close()
