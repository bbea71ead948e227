"""Which GGML type each tensor gets for a file type, as llama.cpp's quantizer chooses (llama-quant.cpp).

A file type such as Q4_K_M is a mix: most weights take its base type (Q4_K), some tensors more
bits (attn_v and ffn_down of some layers, the output matrix), 1-D tensors and norms stay F32, and
a tensor whose rows do not divide into the type's blocks falls back to a type whose blocks fit.
The choice is a pure function of the tensor names, shapes and a few hyperparameters, so it is
planned before any byte is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from converters.gguf.quants.blocks import BLOCK

#: File type -> (its base GGML type, llama_ftype number written to general.file_type).
FILE_TYPES: dict[str, tuple[str, int]] = {
    "F32": ("F32", 0), "F16": ("F16", 1), "BF16": ("BF16", 32), "Q8_0": ("Q8_0", 7),
    "Q4_0": ("Q4_0", 2), "Q4_1": ("Q4_1", 3), "Q5_0": ("Q5_0", 8), "Q5_1": ("Q5_1", 9),
    "Q2_K": ("Q2_K", 10), "Q3_K_S": ("Q3_K", 11), "Q3_K_M": ("Q3_K", 12), "Q4_K_S": ("Q4_K", 14),
    "Q4_K_M": ("Q4_K", 15),
    "Q5_K_S": ("Q5_K", 16), "Q5_K_M": ("Q5_K", 17), "Q6_K": ("Q6_K", 18),
}

#: What a tensor falls back to when its rows do not divide into the chosen type's blocks.
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_FLOAT = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class TensorChoice:
    """The type a tensor is written as, and the fallback that led there, if any."""

    name: str
    qtype: str
    wanted: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class MixParams:
    """The hyperparameters llama.cpp's mix rules read."""

    n_layer: int
    n_head: int
    n_head_kv: int
    is_70b: bool = False
    #: Experts of a mixture (1 for a dense model): eight of them change several rules.
    n_expert: int = 1

    @property
    def n_gqa(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // max(1, self.n_head_kv)


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def _attn_v_like(name: str) -> bool:
    """category_is_attn_v: a fused qkv matrix (Phi-3) takes attn_v's rules and counts as one."""
    return "attn_v.weight" in name or "attn_qkv.weight" in name


def _sort_key(name: str) -> tuple[int, str]:
    """llama.cpp's weights_map order: by layer number (non-layer tensors first), then by name."""
    return (_layer(name), name)


def _quantizable(name: str, ndim: int) -> bool:
    """tensor_allows_quantization for the architectures this converter writes."""
    return ndim >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ffn_gate_inp.weight" not in name


def _mixed(ftype: str, base: str, name: str, ncols: int, p: MixParams, tied: bool, counters: dict[str, int]) -> str:
    """llama_tensor_get_type_impl, for the file types this converter offers (no imatrix, dense models)."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        if ncols % BLOCK[base][0]:
            return "Q8_0"
        return base if base == "Q8_0" else "Q6_K"
    if name == "token_embd.weight":
        return base
    if _attn_v_like(name):
        i, n = counters["attn_v"], counters["n_attn_v"]
        counters["attn_v"] += 1
        new = base
        if ftype == "Q2_K":
            new = "Q4_K" if p.n_gqa >= 4 else "Q3_K"  # (n_expert >= 4 counts only for the IQ2 types)
        elif ftype == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and i < 4:
            new = "Q5_K"
        if p.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        return "Q8_0" if p.n_expert == 8 else new
    if "attn_k.weight" in name and p.n_expert == 8:
        return "Q8_0"
    if "ffn_down" in name:
        # A mixture's ffn_down tensors are not one per layer in order: llama.cpp reads the layer from the name.
        i, n = (counters["ffn_down"] if p.n_expert <= 1 else _layer(name)), p.n_layer
        counters["ffn_down"] += 1
        if ftype == "Q2_K":
            return "Q3_K"
        if ftype == "Q3_K_M":
            return "Q5_K" if i < n // 16 else "Q4_K"
        if ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
            return "Q6_K"
        if ftype == "Q4_K_S" and i < n // 8:
            return "Q5_K"
        return base
    if "attn_output.weight" in name:
        if p.n_expert == 8:
            return "Q5_K" if ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M") else base
        return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(ftype, base)
    return base


def choose_types(ftype: str, tensors: Sequence[tuple[str, tuple[int, ...]]], params: MixParams) -> list[TensorChoice]:
    """The GGML type of every tensor (GGUF name, HF-order shape) for file type `ftype`, in input order."""
    base = FILE_TYPES[ftype][0]
    names = {name for name, _ in tensors}
    tied = "output.weight" not in names
    counters = {"attn_v": 0, "ffn_down": 0, "n_attn_v": sum(_attn_v_like(n) for n in names)}
    chosen: dict[str, TensorChoice] = {}
    for name, shape in sorted(tensors, key=lambda t: _sort_key(t[0])):
        ncols = shape[-1]
        # llama.cpp's quantizer counts ggml's dimensions: a (1, n) matrix (Qwen2-MoE's shared-expert gate) is 1-D
        if not _quantizable(name, len(shape) if base in _FLOAT else len(ggml_shape(shape))):
            chosen[name] = TensorChoice(name, "F32")
            continue
        if base in _FLOAT:
            # llama.cpp's converter (which writes the float files) keeps a shared expert's gate in F32 too;
            # its quantizer (which the other types follow) does quantize it.
            chosen[name] = TensorChoice(name, "F32" if "ffn_gate_inp_shexp.weight" in name else base)
            continue
        new = _mixed(ftype, base, name, ncols, params, tied, counters)
        chosen[name] = _fit(name, new, ncols)
    return [chosen[name] for name, _ in tensors]


def ggml_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape (HF order) as llama.cpp's quantizer writes it: leading dimensions of 1 dropped."""
    i = 0
    while i < len(shape) - 1 and shape[i] == 1:
        i += 1
    return shape[i:]


def _fit(name: str, qtype: str, ncols: int) -> TensorChoice:
    """tensor_type_fallback: a type whose blocks divide the rows, F16 as the last resort."""
    block = BLOCK[qtype][0]
    if ncols % block == 0:
        return TensorChoice(name, qtype)
    used = _FALLBACK.get(qtype, qtype)
    if ncols % BLOCK[used][0]:
        used = "F16"
    return TensorChoice(name, used, wanted=qtype, reason=f"{ncols} columns do not divide into blocks of {block}")
