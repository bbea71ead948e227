"""A Hugging Face causal LM as llama.cpp sees it: architecture, hyperparameters, tensor names and rows.

`plan_model` reads config.json and the safetensors headers only (no tensor data) and refuses an
unsupported architecture, dtype or tensor name before anything is written. `SafetensorsReader`
then hands out rows of one tensor at a time as float32, read into fresh buffers, so that resident
memory does not grow with the model.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.gguf import families
from converters.gguf.quants import widen_bf16
from converters.gguf.quants.blocks import Floats
from registry.convert.safetensors import read_header, read_into
from registry.errors import IntegrityError, UsageError

#: Hugging Face `architectures[0]` -> GGUF architecture.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "GraniteForCausalLM": "granite",
    "Olmo2ForCausalLM": "olmo2",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
    **families.FAMILIES,
}
DTYPES: dict[str, np.dtype[Any]] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_SKIP = ("rotary_emb.inv_freq",)
#: Architectures whose q/k rows llama.cpp's converter permutes (its LlamaModel and the classes built on it).
_PERMUTED = ("llama", "granite")
#: One expert's matrix of a mixture, as transformers saves them: stacked into one GGUF tensor per layer and kind.
_EXPERT = re.compile(r"model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\."
                     r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight")


class UnsupportedModel(UsageError):
    """The snapshot holds a model this converter cannot write as GGUF."""


class InconsistentModel(IntegrityError):
    """config.json and the safetensors headers describe different models (or no model at all)."""


@dataclass(frozen=True)
class SourceTensor:
    """Where a tensor's bytes are in a safetensors file."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class TensorPlan:
    """One GGUF tensor: its name, shape in HF (row-major) order, and how to get its rows."""

    name: str
    shape: tuple[int, ...]
    source: SourceTensor | None
    permute_heads: int = 0
    values: Floats | None = None
    #: The tensor's name in the safetensors source (none for values mreg computes).
    source_name: str = ""
    #: Added to every value as it is read (Gemma's norms are stored as `1 + weight`).
    shift: float = 0.0
    #: A mixture's experts, one 2-D source each, stacked into this 3-D tensor (`source` is the first).
    parts: tuple[SourceTensor, ...] = ()

    @property
    def ncols(self) -> int:
        """Elements per row (GGUF's ne[0])."""
        return self.shape[-1]

    @property
    def nrows(self) -> int:
        """Rows (the product of every dimension but the last)."""
        return math.prod(self.shape[:-1])


@dataclass(frozen=True)
class ModelPlan:
    """Everything about the model but the tokenizer and the chosen types."""

    architecture: str
    hf_architecture: str
    metadata: list[tuple[str, Any]]
    tensors: list[TensorPlan]
    n_layer: int
    n_head: int
    n_head_kv: int
    vocab_size: int
    config: dict[str, Any] = field(default_factory=dict)


def read_safetensors_header(path: Path) -> dict[str, SourceTensor]:
    """The tensors of one safetensors file, from its header alone (checked against the file first)."""
    return {name: SourceTensor(path, e.dtype, e.shape, e.start) for name, e in read_header(path).items()}


def rope_settings(config: dict[str, Any]) -> tuple[float | None, str, dict[str, Any]]:
    """The rope base, scaling kind ("default" when none) and scaling settings, read once for the GGUF
    metadata and the reference pass alike.

    transformers 4 writes `rope_theta` + `rope_scaling`, 5 `rope_parameters`. A scaling without
    `original_max_position_embeddings` gets the model's `max_position_embeddings`, as transformers reads it.
    """
    _check_rope(config)
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    rope = dict(config.get("rope_scaling") or params)
    kind = str(rope.get("rope_type") or rope.get("type") or "default").lower()
    if kind != "default" and not rope.get("original_max_position_embeddings") and config.get("max_position_embeddings"):
        rope["original_max_position_embeddings"] = config["max_position_embeddings"]
    return (None if theta is None else float(theta)), kind, rope


#: The numbers of a rope table that the GGUF metadata or the reference pass compute with.
_ROPE_NUMBERS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast",
                 "beta_slow", "partial_rotary_factor")


def _check_rope(config: dict[str, Any]) -> None:
    """Every rope setting a number where one is computed with (`"factor": "big"` is refused here, by name,
    rather than failing deep in a float() or a numpy call)."""
    if config.get("rope_theta") is not None:
        _number(config, "rope_theta", 1.0)
    for label in ("rope_scaling", "rope_parameters"):
        table = config.get(label)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise InconsistentModel(f"config.json {label} is {type(table).__name__}, not an object",
                                    hint="fix config.json: it must describe the weights it ships with")
        # transformers 5 nests one table per attention kind (Gemma 3's full_attention, sliding_attention)
        for where, sub in [(label, table), *((f"{label}.{k}", v) for k, v in table.items() if isinstance(v, dict))]:
            for key in _ROPE_NUMBERS:
                if sub.get(key) is not None:
                    _number(sub, key, 1.0, label=f"{where}.{key}")
            for key in ("mscale", "mscale_all_dim"):  # 0 means "no gain", so these may be 0
                value = sub.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                          or not 0 <= value < float("inf")):
                    raise InconsistentModel(f"config.json {where}.{key} = {_shown(value)} is not a number of 0 or "
                                            "more", hint="fix config.json: it must describe the weights it ships with")
            if sub.get("original_max_position_embeddings") is not None:
                _size(sub, "original_max_position_embeddings", label=f"{where}.original_max_position_embeddings")
            kind = sub.get("rope_type", sub.get("type"))
            if kind is not None and not isinstance(kind, str):
                raise InconsistentModel(f"config.json {where}.rope_type = {kind!r} is not a name",
                                        hint="fix config.json: it must describe the weights it ships with")


def _rope_metadata(arch: str, config: dict[str, Any], head_dim: int) -> tuple[list[tuple[str, Any]], Floats | None]:
    """rope.* keys, and llama3-style frequency factors (a rope_freqs tensor), from the rope settings."""
    meta: list[tuple[str, Any]] = []
    theta, kind, rope = rope_settings(config)
    if theta is not None:
        meta.append((f"{arch}.rope.freq_base", theta))
    if kind == "default":
        return meta, None
    factor = float(rope.get("factor", 1.0))
    if kind == "linear":
        meta += [(f"{arch}.rope.scaling.type", "linear"), (f"{arch}.rope.scaling.factor", factor)]
        return meta, None
    if kind == "yarn":
        meta += [(f"{arch}.rope.scaling.type", "yarn"), (f"{arch}.rope.scaling.factor", factor),
                 (f"{arch}.rope.scaling.original_context_length", int(rope["original_max_position_embeddings"]))]
        return meta, None
    if kind == "llama3":
        base = theta if theta is not None else 10000.0
        freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
        old = float(rope.get("original_max_position_embeddings", 8192))
        factors = []
        for freq in freqs:
            wavelen = 2 * math.pi / float(freq)
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return meta, np.asarray(factors, dtype=np.float32)
    raise UnsupportedModel(f"rope_scaling type {kind!r} is not supported", hint="supported: linear, yarn, llama3")


def check_architecture(config: dict[str, Any]) -> str:
    """llama.cpp's name for the config's architecture, or the refusal naming the supported ones."""
    archs = config.get("architectures")
    hf_arch = str(archs[0]) if isinstance(archs, list) and archs else "?"
    arch = ARCHITECTURES.get(hf_arch)
    if arch is None:
        raise UnsupportedModel(f"architecture {hf_arch} is not supported by --to gguf",
                               hint=f"supported: {', '.join(sorted(ARCHITECTURES))}")
    return arch


def plan_model(config: dict[str, Any], weights: dict[str, SourceTensor], name: str) -> ModelPlan:
    """Map an HF config and its weights onto GGUF names and metadata, or say what is unsupported.

    Tensor names come from gguf's own map; what differs by architecture is the metadata (`_metadata`, and
    converters/gguf/families.py for Phi-3 and Gemma), llama's q/k permutation, Gemma's norm shift and a
    mixture's experts stacked into one 3-D tensor per layer and kind.
    """
    import gguf

    arch = check_architecture(config)
    n_layer, n_embd, n_head, n_head_kv, n_ff, vocab_size, head_dim = config_sizes(config)
    check_shapes(weights, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 vocab_size=vocab_size, head_dim=head_dim)
    meta, extra = _metadata(arch, config, name, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                            n_ff=n_ff, vocab_size=vocab_size, head_dim=head_dim)
    mapping = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), n_layer)
    tensors: list[TensorPlan] = []
    unknown: list[str] = []
    experts: dict[str, dict[int, SourceTensor]] = {}
    for hf_name in sorted(weights, key=_hf_order):
        src = weights[hf_name]
        expert = _EXPERT.fullmatch(hf_name)
        if expert is not None:
            # The names llama.cpp's converter gives the stacked tensor before it maps them (Qwen's, Mixtral's)
            merged = (f"model.layers.{expert[1]}.mlp.experts.{expert[4]}.weight" if expert[2] == "mlp"
                      else f"layers.{expert[1]}.feed_forward.experts.{expert[4]}.weight")
            if merged not in experts:
                experts[merged] = {}
                tensors.append(TensorPlan(merged, (), src, source_name=merged))  # placeholder, in llama.cpp's order
            experts[merged][int(expert[3])] = src
            continue
        if hf_name.endswith(_SKIP) or (hf_name == "lm_head.weight" and (
                config.get("tie_word_embeddings") or arch in ("gemma", "gemma2"))):  # they reuse token_embd
            continue
        gg = mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg is None:
            unknown.append(hf_name)
            continue
        if src.dtype not in DTYPES:
            raise UnsupportedModel(f"tensor {hf_name} has dtype {src.dtype}", hint="supported: F32, F16, BF16")
        permute = 0
        if arch in _PERMUTED and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            permute = n_head
        elif arch in _PERMUTED and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            permute = n_head_kv
        shape = src.shape if len(src.shape) > 1 else (src.shape[0],)
        tensors.append(TensorPlan(gg, shape, src, permute, source_name=hf_name,
                                  shift=families.norm_shift(arch, hf_name)))
    tensors = [_stack(t, experts[t.name], mapping, n_expert=n_experts(config), dtypes=DTYPES)
               if t.name in experts else t for t in tensors]
    if unknown:
        raise UnsupportedModel(f"{len(unknown)} tensors have no GGUF name for {arch}: {', '.join(unknown[:5])}",
                               hint="the checkpoint has parts this converter does not know (adapters, vision tower?)")
    tensors[:0] = [TensorPlan(gg, (len(values),), None, values=values) for gg, values in extra]
    names = {t.name for t in tensors}
    if "token_embd.weight" not in names:
        raise UnsupportedModel("the checkpoint has no token embedding (model.embed_tokens.weight)")
    return ModelPlan(arch, str(config["architectures"][0]), meta, tensors, n_layer, n_head, n_head_kv, vocab_size,
                     config)


def n_experts(config: dict[str, Any]) -> int:
    """Experts per layer (1 for a dense model): `num_experts` as Qwen writes it, `num_local_experts` as
    transformers 5 and Mixtral do."""
    key = "num_experts" if config.get("num_experts") else "num_local_experts"
    return _size(config, key) if config.get(key) else 1


def _stack(placeholder: TensorPlan, parts: dict[int, SourceTensor], mapping: Any, n_expert: int,
           dtypes: dict[str, Any]) -> TensorPlan:
    """The 3-D GGUF tensor (experts, rows, columns) of one layer's expert matrices, or a refusal naming the gap."""
    name = placeholder.name
    gg = mapping.get_name(name, try_suffixes=(".weight",))
    shapes = {tuple(p.shape) for p in parts.values()}
    if gg is None or sorted(parts) != list(range(n_expert)) or len(shapes) != 1:
        raise InconsistentModel(f"{name}: experts {sorted(parts)[:8]} of shapes {sorted(shapes)[:3]}, config.json says "
                                f"{n_expert} experts of one shape", hint="the checkpoint is incomplete or damaged")
    bad = sorted({p.dtype for p in parts.values()} - set(dtypes))
    if bad:
        raise UnsupportedModel(f"tensor {name} has dtype {bad[0]}", hint="supported: F32, F16, BF16")
    (shape,) = shapes
    ordered = tuple(parts[e] for e in range(n_expert))
    return TensorPlan(gg, (n_expert, *shape), ordered[0], source_name=name, parts=ordered)


def _metadata(arch: str, config: dict[str, Any], name: str,
              **n: int) -> tuple[list[tuple[str, Any]], list[tuple[str, Floats]]]:
    """The header's general.* and {arch}.* keys, and the tensors computed from config (rope factors)."""
    meta: list[tuple[str, Any]] = [("general.architecture", arch), ("general.type", "model"), ("general.name", name)]
    eps = _number(config, "rms_norm_eps", 1e-6)
    n["context"] = _size(config, "max_position_embeddings", 4096)
    _check_rope(config)  # the family paths below read the same tables
    try:
        if arch == "phi3":
            more, extra = families.phi3(config, n, eps)
            return meta + more, extra
        if arch == "gemma":
            return meta + families.gemma(config, n, eps), []
        if arch == "gemma2":
            return meta + families.gemma2(config, n, eps), []
        if arch == "gemma3":
            return meta + families.gemma3(config, n, eps), []
    except (KeyError, TypeError, ValueError) as e:
        raise UnsupportedModel(f"config.json of {arch}: {e}", hint="llama.cpp cannot read this model either") from e
    meta += [
        (f"{arch}.block_count", n["n_layer"]), (f"{arch}.context_length", n["context"]),
        (f"{arch}.embedding_length", n["n_embd"]), (f"{arch}.feed_forward_length", n["n_ff"]),
        (f"{arch}.attention.head_count", n["n_head"]), (f"{arch}.attention.head_count_kv", n["n_head_kv"]),
        (f"{arch}.attention.layer_norm_rms_epsilon", eps),
    ]
    rope_meta, rope_freqs = _rope_metadata(arch, config, n["head_dim"])
    meta += rope_meta
    # transformers 5 writes `"head_dim": null` for Mixtral, llama.cpp skips it; its Granite converter drops it
    if config.get("head_dim") and arch != "granite":
        meta += [(f"{arch}.attention.key_length", n["head_dim"]), (f"{arch}.attention.value_length", n["head_dim"])]
    if arch in _PERMUTED:
        meta += [(f"{arch}.vocab_size", n["vocab_size"]), (f"{arch}.rope.dimension_count", n["head_dim"])]
    if arch == "granite":
        meta += families.granite(config)
    if arch == "olmo2" and config.get("sliding_window") is not None:
        raise UnsupportedModel("OLMo with sliding-window layers (OLMo 3's layout) is not supported by --to gguf",
                               hint="OLMo 2 (no sliding window) is")
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise UnsupportedModel("a mixture of experts with dense layers (mlp_only_layers, decoder_sparse_step)",
                               hint="llama.cpp's qwen3moe has experts in every layer")
    if n_experts(config) > 1:
        meta += [(f"{arch}.expert_count", n_experts(config)),
                 (f"{arch}.expert_used_count", _size(config, "num_experts_per_tok"))]
    if arch in ("qwen2moe", "qwen3moe"):
        meta.append((f"{arch}.expert_feed_forward_length", _size(config, "moe_intermediate_size")))
    if arch == "qwen2moe" and config.get("shared_expert_intermediate_size") is not None:
        meta.append((f"{arch}.expert_shared_feed_forward_length", _size(config, "shared_expert_intermediate_size")))
    return meta, [] if rope_freqs is None else [("rope_freqs.weight", rope_freqs)]


#: Largest size mreg plans for (2^31): what the config says is checked against the weights, but a number
#: past this is no model at all, and would make even the plan (a name per layer) exhaust memory.
MAX_SIZE = 1 << 31


def _size(config: dict[str, Any], key: str, default: int | None = None, *, label: str | None = None) -> int:
    """A positive integer field of config.json, or a one-line refusal naming it (as `label`, when nested)."""
    value = config.get(key, default)
    if value is None:
        raise UnsupportedModel(f"config.json lacks {label or key}", hint="the snapshot's config.json is incomplete")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
        raise InconsistentModel(f"config.json {label or key} = {_shown(value)} is not a size (a whole number from 1 "
                                "to 2^31)", hint="fix config.json: it must describe the weights it ships with")
    return value


def _number(config: dict[str, Any], key: str, default: float, *, label: str | None = None) -> float:
    """A finite, positive float field of config.json (absent: the default)."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise InconsistentModel(f"config.json {label or key} = {_shown(value)} is not a positive number",
                                hint="fix config.json: it must describe the weights it ships with")
    return float(value)


def _shown(value: Any) -> str:
    """A config value for an error line, cut short (a 5,000-digit number, a long string)."""
    if isinstance(value, int) and value.bit_length() > 64:  # repr() refuses past 4,300 digits
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_sizes(config: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """Layers, width, heads, KV heads, feed-forward width, vocabulary, head size, each checked."""
    n_head = _size(config, "num_attention_heads")
    n_embd = _size(config, "hidden_size")
    n_head_kv = _size(config, "num_key_value_heads", n_head) if config.get("num_key_value_heads") else n_head
    head_dim = _size(config, "head_dim") if config.get("head_dim") else n_embd // n_head
    if head_dim == 0 or n_head % n_head_kv:
        raise InconsistentModel(f"config.json: {n_head} attention heads of width {n_embd} over {n_head_kv} KV heads "
                                "is not a valid attention shape", hint="fix config.json")
    return (_size(config, "num_hidden_layers"), n_embd, n_head, n_head_kv, _size(config, "intermediate_size"),
            _size(config, "vocab_size"), head_dim)



def _layer_number(part: str) -> bool:
    """Whether a tensor-name part is a layer number: ASCII digits (str.isdigit also takes '²', which int() refuses,
    and '١', which it reads as 1), short enough to be one."""
    return part.isascii() and part.isdigit() and len(part) <= 9

def check_shapes(weights: dict[str, SourceTensor], **sizes: int) -> None:
    """The config's sizes against the safetensors headers, before anything is planned or allocated.

    transformers refuses to load a checkpoint whose tensors disagree with its config; so does this.
    """
    layers = {int(p[i + 1]) for n in weights for p in [n.split(".")] for i in range(len(p) - 1)
              if p[i] == "layers" and _layer_number(p[i + 1])}
    problems = []
    if layers and (len(layers) != sizes["n_layer"] or min(layers) != 0 or max(layers) != sizes["n_layer"] - 1):
        problems.append(f"num_hidden_layers is {sizes['n_layer']} but the weights hold layers "
                        f"{min(layers)}..{max(layers)} ({len(layers)} of them)")
    q_rows, kv_rows = sizes["n_head"] * sizes["head_dim"], sizes["n_head_kv"] * sizes["head_dim"]
    expected = {"embed_tokens.weight": (sizes["vocab_size"], sizes["n_embd"]),
                "self_attn.q_proj.weight": (q_rows, sizes["n_embd"]),
                "self_attn.k_proj.weight": (kv_rows, sizes["n_embd"]),
                "self_attn.v_proj.weight": (kv_rows, sizes["n_embd"]),
                "mlp.gate_proj.weight": (sizes["n_ff"], sizes["n_embd"]),
                "self_attn.qkv_proj.weight": (q_rows + 2 * kv_rows, sizes["n_embd"]),
                "mlp.gate_up_proj.weight": (2 * sizes["n_ff"], sizes["n_embd"])}
    for name, tensor in weights.items():
        want = next((s for suffix, s in expected.items() if name.endswith(suffix)), None)
        if want is not None and tuple(tensor.shape) != want:
            problems.append(f"{name} has shape {list(tensor.shape)}, config.json says {list(want)}")
    if problems:
        raise InconsistentModel(f"config.json disagrees with the weights: {'; '.join(problems[:3])}",
                                hint="the checkpoint is damaged or its config belongs to another model; nothing "
                                     "was written")


def _hf_order(name: str) -> tuple[int, str]:
    """Embeddings first, then layer by layer, then the rest: the order llama.cpp's converter writes."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and _layer_number(parts[i + 1]):
            return (int(parts[i + 1]) + 1, name)
    return (0 if "embed" in name else 1 << 30, name)


class SafetensorsReader:
    """Rows of source tensors as float32, read with pread(2) into fresh buffers.

    Reading rather than mapping keeps resident memory flat without page-fault and madvise costs
    (a third less system time on a 1.1 B model) and without the read-around pages a mapping
    faults in beyond the range it asked for.
    """

    def __init__(self) -> None:
        self._files: dict[Path, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: Path) -> int:
        """The descriptor of a shard, opened on first use (each shard once)."""
        with self._lock:  # encoding threads share the descriptors
            if path not in self._files:
                self._files[path] = os.open(path, os.O_RDONLY)
            return self._files[path]

    def rows(self, t: TensorPlan, start: int, stop: int) -> Floats:
        """Rows [start, stop) of a tensor (2-D view: rows x ncols), llama's q/k head permutation applied."""
        if t.values is not None:
            return t.values.reshape(-1, t.ncols)[start:stop].astype(np.float32)
        if t.parts:  # stacked experts: each expert's rows from its own tensor, one at a time
            per = t.shape[-2]
            pieces = []
            for e in range(start // per, (stop - 1) // per + 1):
                a, b = max(start, e * per) - e * per, min(stop, (e + 1) * per) - e * per
                pieces.append(self._read(t.parts[e], a, b, t.ncols))
            out = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            return np.ascontiguousarray(out + np.float32(t.shift) if t.shift else out)
        src = t.source
        assert src is not None
        out = self._read(src, start, stop, t.ncols)
        if t.permute_heads:
            head = t.nrows // t.permute_heads
            # HF stores each head's rotary halves apart; llama.cpp wants them interleaved.
            out = out.reshape(-1, 2, head // 2, t.ncols).swapaxes(1, 2).reshape(stop - start, t.ncols)
        if t.shift:
            out = out + np.float32(t.shift)
        return np.ascontiguousarray(out)

    def _read(self, src: SourceTensor, start: int, stop: int, ncols: int) -> Floats:
        """Rows [start, stop) of one source tensor as float32."""
        dtype = DTYPES[src.dtype]
        count = (stop - start) * ncols
        raw = np.empty(count, dtype=dtype)
        pread_exact(self.fd(src.path), raw, src.offset + start * ncols * dtype.itemsize)
        return widen(raw, src.dtype).reshape(stop - start, ncols)

    def head_rows(self, t: TensorPlan) -> int:
        """Rows that must be read together (one attention head for permuted tensors)."""
        return t.nrows // t.permute_heads if t.permute_heads else 1

    def close(self) -> None:
        """Close every file."""
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


def widen(raw: np.ndarray[Any, Any], dtype: str, out: Floats | None = None) -> Floats:
    """Source values (read as `DTYPES[dtype]`) as float32, into `out` when given.

    bfloat16 is the top half of a float32: widening is a shift, exact. ggml-cpu's widening does it in one
    vectorized pass where llama-cpp-python is installed (`converters.gguf.quants.widen_bf16`); else one
    ufunc into the wide type (0.2 ns per value; astype-then-shift took 2.1).
    """
    if dtype == "BF16":
        target: Floats = np.empty(raw.shape, np.float32) if out is None else out
        if widen_bf16(raw.view(np.uint16), target):
            return target
        shifted: Floats = np.left_shift(raw, 16, out=target.view(np.uint32), dtype=np.uint32).view(np.float32)
        return shifted
    if out is None:
        return raw.astype(np.float32)
    np.copyto(out, raw)
    return out


def pread_exact(fd: int, buf: np.ndarray[Any, Any], offset: int) -> None:
    """Fill `buf` from `fd` at `offset` (pread may return less than asked); a file too short is refused."""
    view = buf.data.cast("B")
    if read_into(fd, view, offset) < len(view):
        raise UnsupportedModel("a safetensors file is shorter than its header says",
                               hint="the file is truncated: pull the model again")


def load_weights(files: Iterable[Path]) -> dict[str, SourceTensor]:
    """Every tensor of a set of safetensors files; a name in two files is an error."""
    out: dict[str, SourceTensor] = {}
    for path in files:
        for name, t in read_safetensors_header(path).items():
            if name in out:
                raise UnsupportedModel(f"tensor {name} appears in two safetensors files")
            out[name] = t
    return out
