"""A GGUF file planned before its first byte: model, vocabulary, every tensor's type, the header's metadata.

Planning reads only config.json, the tokenizer files and the safetensors headers, so an
unsupported model or a bad type fails before any output; several file types share one reading.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from converters.gguf import families
from converters.gguf.file import TensorInfo
from converters.gguf.mix import FILE_TYPES, MixParams, TensorChoice, choose_types, ggml_shape
from converters.gguf.model import (
    ModelPlan,
    UnsupportedModel,
    check_architecture,
    config_sizes,
    load_weights,
    n_experts,
    plan_model,
)
from converters.gguf.quants.blocks import row_bytes
from converters.gguf.vocab import Vocab, load_vocab
from registry.convert.configs import read_object
from registry.errors import MregError

DEFAULT_TYPE = "F16"
#: The architectures llama.cpp's converter takes through its Llama path (conversion/llama.py and its subclasses),
#: which writes tokenizer_config.json's `add_prefix_space` as `tokenizer.ggml.add_space_prefix`.
LLAMA_PATH = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "GraniteForCausalLM")
QUANTIZATION_VERSION = 2


@dataclass(frozen=True)
class EncodedTensor:
    """What was written for one tensor: its first and last bytes, its encoding error on sampled rows, its
    NaN/Inf values in the source and in what was written (every row), and the encoder that wrote it."""

    info: TensorInfo
    choice: TensorChoice
    head: bytes
    tail: bytes
    rel_rmse: float
    max_abs_err: float
    source_nonfinite: int = 0
    encoded_nonfinite: int = 0
    encoder: str = ""


@dataclass(frozen=True)
class GGUFPlan:
    """Everything decided before the first byte: model, vocab, per-tensor types, header."""

    file_type: str
    model: ModelPlan
    vocab: Vocab
    choices: list[TensorChoice]
    infos: list[TensorInfo]
    metadata: list[tuple[str, Any]]


def _tensor_infos(model: ModelPlan, choices: list[TensorChoice], file_type: str) -> list[TensorInfo]:
    """Each tensor's header entry; the quantized types' shapes as llama.cpp's quantizer writes them."""
    quantized = FILE_TYPES[file_type][0] not in ("F32", "F16", "BF16")
    return [TensorInfo(t.name, tuple(reversed(ggml_shape(t.shape) if quantized else t.shape)), c.qtype,
                       t.nrows * row_bytes(c.qtype, t.ncols))
            for t, c in zip(model.tensors, choices, strict=True)]


#: Deeper than any model: config.json alone is not judged past this (the full plan is, after the download).
PRE_PLAN_MAX_LAYERS = 1024


def needs_imatrix(config: dict[str, Any], file_type: str) -> tuple[str, str] | None:
    """From config.json alone, before any weight is downloaded: the first tensor (name, type) that llama.cpp would
    write as `file_type` only with an importance matrix, or None (also when config.json cannot say: the plan
    made after the download judges it then). Each layer's attention and feed-forward matrices are planned from
    the config's sizes, as dense ones: every file type that needs a matrix needs it for these first."""
    try:
        arch = check_architecture(config)
        n_layer, n_embd, n_head, n_head_kv, n_ff, vocab, head_dim = config_sizes(config)
    except (UnsupportedModel, ValueError, TypeError, KeyError, MregError):
        return None
    if n_layer > PRE_PLAN_MAX_LAYERS:
        return None
    q, kv = n_head * head_dim, n_head_kv * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, n_embd))]
    for i in range(n_layer):
        shapes += [(f"blk.{i}.attn_q.weight", (q, n_embd)), (f"blk.{i}.attn_k.weight", (kv, n_embd)),
                   (f"blk.{i}.attn_v.weight", (kv, n_embd)), (f"blk.{i}.attn_output.weight", (n_embd, q)),
                   (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)), (f"blk.{i}.ffn_up.weight", (n_ff, n_embd)),
                   (f"blk.{i}.ffn_down.weight", (n_embd, n_ff))]
    params = MixParams(n_layer, n_head, n_head_kv, arch in ("llama", "qwen2") and n_layer == 80)
    first = next((c for c in choose_types(file_type, shapes, params) if c.needs_imatrix), None)
    return None if first is None else (first.name, first.qtype)


def _hf_architecture(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def plan(directory: Path, safetensors: list[Path], file_type: str, name: str) -> GGUFPlan:
    """Read config, tokenizer and safetensors headers; choose every tensor's type; no output yet."""
    return plans(directory, safetensors, [file_type], name)[0]


def plans(directory: Path, safetensors: list[Path], file_types: Sequence[str], name: str,
          has_imatrix: Sequence[bool] = (), config: dict[str, Any] | None = None) -> list[GGUFPlan]:
    """One plan per type; config, headers and tokenizer are read once for all of them; `has_imatrix` per type:
    whether it is quantized with an importance matrix (some of llama.cpp's rules change with one); `config`:
    config.json when the caller has read it."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise UnsupportedModel("the snapshot has no config.json", hint="GGUF needs the model's config.json")
    if not safetensors:
        raise UnsupportedModel("the snapshot has no .safetensors weights",
                               hint="GGUF is converted from safetensors; pickle weights are not read")
    if config is None:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    model = plan_model(config, load_weights(safetensors), name)
    vocab = load_vocab(directory, model.vocab_size, config)
    if model.architecture in families.GEMMAS and vocab.model == "llama":
        vocab.add_space_prefix = False  # llama.cpp's converter says so for every Gemma SentencePiece model
    prefix = (read_object(directory / "tokenizer_config.json") or {}).get("add_prefix_space")
    if _hf_architecture(config) in LLAMA_PATH and isinstance(prefix, bool):
        vocab.add_space_prefix = prefix  # as transformers tokenizes, whatever the tokenizer's own normalizer says
    if model.architecture == "gemma":
        vocab.special.ids.setdefault("eot", families.GEMMA_EOT)
    is_70b = model.architecture in ("llama", "qwen2") and model.n_layer == 80
    shapes = [(t.name, t.shape) for t in model.tensors]
    mix = MixParams(model.n_layer, model.n_head, model.n_head_kv, is_70b,
                    n_expert=n_experts(model.config))
    out = []
    for file_type, weighted in zip(file_types, list(has_imatrix) or [False] * len(file_types), strict=True):
        choices = choose_types(file_type, shapes, replace(mix, has_imatrix=weighted))
        metadata = [*model.metadata[:3], ("general.file_type", FILE_TYPES[file_type][1]),
                    ("general.quantization_version", QUANTIZATION_VERSION), *model.metadata[3:], *vocab.metadata()]
        out.append(GGUFPlan(file_type, model, vocab, choices, _tensor_infos(model, choices, file_type), metadata))
    return out
