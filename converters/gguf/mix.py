"""Which GGML type each tensor gets for a file type, as llama.cpp's quantizer chooses (llama-quant.cpp).

A file type such as Q4_K_M is a mix: most weights take its base type (Q4_K), some tensors more
bits (attn_v and ffn_down of some layers, the output matrix), 1-D tensors and norms stay F32, and
a tensor whose rows do not divide into the type's blocks falls back to a type whose blocks fit.
The choice is a pure function of the tensor names, shapes and a few hyperparameters, so it is
planned before any byte is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from converters.gguf.quants.blocks import BLOCK

#: File type -> (its base GGML type, llama_ftype number written to general.file_type).
FILE_TYPES: dict[str, tuple[str, int]] = {
    "F32": ("F32", 0), "F16": ("F16", 1), "BF16": ("BF16", 32), "Q8_0": ("Q8_0", 7),
    "Q4_0": ("Q4_0", 2), "Q4_1": ("Q4_1", 3), "Q5_0": ("Q5_0", 8), "Q5_1": ("Q5_1", 9),
    "Q2_K": ("Q2_K", 10), "Q2_K_S": ("Q2_K", 21), "Q3_K_S": ("Q3_K", 11), "Q3_K_M": ("Q3_K", 12),
    "Q3_K_L": ("Q3_K", 13), "Q4_K_S": ("Q4_K", 14), "Q4_K_M": ("Q4_K", 15),
    "Q5_K_S": ("Q5_K", 16), "Q5_K_M": ("Q5_K", 17), "Q6_K": ("Q6_K", 18),
    "IQ1_S": ("IQ1_S", 24), "IQ1_M": ("IQ1_M", 31), "IQ2_XXS": ("IQ2_XXS", 19), "IQ2_XS": ("IQ2_XS", 20),
    "IQ2_S": ("IQ2_XS", 28), "IQ2_M": ("IQ2_S", 29), "IQ3_XXS": ("IQ3_XXS", 23), "IQ3_XS": ("IQ3_S", 22),
    "IQ3_S": ("IQ3_S", 26), "IQ3_M": ("IQ3_S", 27), "IQ4_NL": ("IQ4_NL", 25), "IQ4_XS": ("IQ4_XS", 30),
}

#: What a tensor falls back to when its rows do not divide into the chosen type's blocks.
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
             **{t: "IQ4_NL" for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS")}}
_FLOAT = ("F32", "F16", "BF16")
#: The file types of llama.cpp's IQ1/IQ2 rules (their own branch of llama_tensor_get_type_impl).
_IQ2_FAMILY = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
#: GGML types that llama.cpp quantizes only with an importance matrix (tensor_requires_imatrix).
_NEEDS_IMATRIX = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S")


@dataclass(frozen=True)
class TensorChoice:
    """The type a tensor is written as, and the fallback that led there, if any."""

    name: str
    qtype: str
    wanted: str | None = None
    reason: str | None = None
    #: llama.cpp refuses to write this tensor without an importance matrix (tensor_requires_imatrix).
    needs_imatrix: bool = False


@dataclass(frozen=True)
class MixParams:
    """The hyperparameters llama.cpp's mix rules read."""

    n_layer: int
    n_head: int
    n_head_kv: int
    is_70b: bool = False
    #: Experts of a mixture (1 for a dense model): eight of them change several rules.
    n_expert: int = 1
    #: An importance matrix is given: some IQ3/IQ4 and Q4_0/Q5_0 rules change with it.
    has_imatrix: bool = False

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


def _output(ftype: str, base: str, ncols: int) -> str:
    """output.weight (and a tied token_embd): Q8_0 when its rows do not fit the base blocks, else more bits."""
    if ncols % BLOCK[base][0]:
        return "Q8_0"
    if ftype in (*_IQ2_FAMILY, "IQ3_XXS"):
        return "Q5_K"
    return base if base == "Q8_0" else "Q6_K"


def _token_embd(ftype: str, base: str) -> str:
    if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
        return "Q2_K"
    if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
        return "IQ3_S"
    return base


def _iq2_family(ftype: str, base: str, name: str, p: MixParams, counters: dict[str, int]) -> str:
    """The branch of llama_tensor_get_type_impl for the 1- and 2-bit IQ file types."""
    s_or_m = ftype in ("IQ2_S", "IQ2_M")
    if _attn_v_like(name):
        counters["attn_v"] += 1
        if p.n_gqa >= 4 or p.n_expert >= 4:
            return "Q4_K"
        return "IQ3_S" if s_or_m else "Q2_K"
    if p.n_expert == 8 and "attn_k.weight" in name:
        return "Q4_K"
    if _category(name) == "ffn_down":
        i = counters["ffn_down"]
        counters["ffn_down"] += 1
        if i < p.n_layer // 8:
            return "IQ3_S" if s_or_m else "Q2_K"
        return base
    if "attn_output.weight" in name:
        if p.n_expert == 8:
            return "Q5_K"
        if ftype in ("IQ1_S", "IQ1_M"):
            return "IQ2_XXS"
        return "IQ3_S" if s_or_m else base
    return base


def _attn_v(ftype: str, base: str, p: MixParams, counters: dict[str, int]) -> str:
    i, n = counters["attn_v"], counters["n_attn_v"]
    counters["attn_v"] += 1
    gqa4 = p.n_gqa >= 4
    new = base
    if ftype == "Q2_K":
        new = "Q4_K" if gqa4 else "Q3_K"  # (n_expert >= 4 counts only for the IQ2 types)
    elif ftype == "Q2_K_S" and gqa4:
        new = "Q4_K"
    elif ftype == "IQ3_XXS":
        new = "Q4_K" if gqa4 else "IQ3_XXS" if p.has_imatrix else "IQ3_S"
    elif (ftype in ("IQ3_XS", "IQ3_S") and gqa4) or ftype == "IQ3_M":
        new = "Q4_K"
    elif ftype == "Q3_K_M":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif ftype == "Q3_K_L" or (ftype in ("IQ4_NL", "IQ4_XS") and gqa4):
        new = "Q5_K"
    elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
        new = "Q6_K"
    elif ftype == "Q4_K_S" and i < 4:
        new = "Q5_K"
    if p.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"
    return "Q8_0" if p.n_expert == 8 else new


def _ffn_down(ftype: str, base: str, name: str, p: MixParams, counters: dict[str, int]) -> str:
    # A mixture's ffn_down tensors are not one per layer in order: llama.cpp reads the layer from the name.
    i, n = (counters["ffn_down"] if p.n_expert <= 1 else _layer(name)), p.n_layer
    counters["ffn_down"] += 1
    if ftype == "Q2_K":
        return "Q3_K"
    if ftype == "Q2_K_S":
        return "Q4_K" if i < n // 8 else base
    if ftype == "IQ3_XXS" and not p.has_imatrix:
        return "Q4_K" if i < n // 8 else "Q3_K"
    if ftype == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K"
    if ftype == "IQ3_M" and (i < n // 8 or (p.n_expert == 8 and _more_bits(i, n))):
        return "Q4_K"
    if ftype == "Q3_K_L":
        return "Q5_K"
    if ftype == "Q4_K_M":
        return "Q6_K" if _more_bits(i, n) else base
    if i < n // 8 and ftype in ("IQ4_NL", "IQ4_XS") and not p.has_imatrix:
        return "Q5_K"
    if ftype == "Q5_K_M":
        return "Q6_K" if _more_bits(i, n) else base
    if ftype == "Q4_K_S":
        return "Q5_K" if i < n // 8 else base
    if ftype in ("Q4_0", "Q5_0") and p.has_imatrix and i < n // 8:
        return "Q4_1" if ftype == "Q4_0" else "Q5_1"
    return base


#: attn_output of a dense model (or one of other than eight experts) in these file types.
_ATTN_OUTPUT = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}
#: attn_output of a mixture of eight experts takes Q5_K in these file types.
_ATTN_OUTPUT_8X = ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M",
                   "IQ4_XS")


def _category(name: str) -> str:
    """tensor_get_category, for the tensors of the architectures written here (first match wins)."""
    for key in ("attn_qkv.weight", "attn_v.weight", "attn_k.weight", "attn_q.weight", "attn_output.weight",
                "ffn_up", "ffn_gate", "ffn_down"):
        if key in name:
            return key
    return "other"


def _mixed(ftype: str, base: str, name: str, ncols: int, p: MixParams, tied: bool, counters: dict[str, int]) -> str:
    """llama_tensor_get_type_impl, for the file types this converter offers (dense models and mixtures)."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return _output(ftype, base, ncols)
    if name == "token_embd.weight":
        return _token_embd(ftype, base)
    if ftype in _IQ2_FAMILY:
        return _iq2_family(ftype, base, name, p, counters)
    category = _category(name)
    if _attn_v_like(name):
        return _attn_v(ftype, base, p, counters)
    if category == "attn_k.weight":
        if p.n_expert == 8:
            return "Q8_0"
        return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ftype, base)
    if category == "attn_q.weight":
        return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ftype, base)
    if category == "ffn_down":
        return _ffn_down(ftype, base, name, p, counters)
    if category == "attn_output.weight":
        if p.n_expert == 8:
            return "Q5_K" if ftype in _ATTN_OUTPUT_8X else base
        return _ATTN_OUTPUT.get(ftype, base)
    if category in ("ffn_gate", "ffn_up"):
        i = counters[category] if p.n_expert <= 1 else _layer(name)
        counters[category] += 1
        if ftype == "IQ3_XS" and p.n_layer // 8 <= i < 7 * p.n_layer // 8:
            return "IQ3_XXS"
    return base


def choose_types(ftype: str, tensors: Sequence[tuple[str, tuple[int, ...]]], params: MixParams) -> list[TensorChoice]:
    """The GGML type of every tensor (GGUF name, HF-order shape) for file type `ftype`, in input order."""
    base = FILE_TYPES[ftype][0]
    names = {name for name, _ in tensors}
    tied = "output.weight" not in names
    counters = {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0, "n_attn_v": sum(_attn_v_like(n) for n in names)}
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
        fit = _fit(name, new, ncols)
        needs = name not in ("token_embd.weight", "output.weight") and (
            fit.qtype in _NEEDS_IMATRIX or (fit.qtype == "Q2_K" and ftype == "Q2_K_S"))
        chosen[name] = replace(fit, needs_imatrix=needs) if needs else fit
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
