"""Tiny llama-shaped causal language models: LlamaForCausalLM, and Qwen2ForCausalLM (the same weights plus q/k/v
biases, with a ChatML tokenizer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.tiny_models.base import (
    _FLOAT_DTYPES,
    TRANSFORMERS_VERSION,
    _encode,
    _init_values,
    _prepare_dest,
    _split_even,
    _write_json,
    _write_readme,
    _write_weights,
)
from support.tiny_models.tensors import _DTYPE_SIZE, _Tensor
from support.tiny_models.tokenizer import (
    _added_tokens_decoder,
    _byte_bpe,
    _byte_level_tokenizer_json,
    _special_entry,
    _template_special,
)

_CAUSAL_SPECIAL_COUNT = 3

_LLAMA_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message %}"
    "{{- '[INST] <<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] + ' [/INST]' }}"
    "{%- else %}"
    "{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)

_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class _CausalSpec:
    """The architecture of a llama-shaped causal language model."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    max_position_embeddings: int = 256

    @property
    def head_dim(self) -> int:
        """Return the width of one attention head."""
        return self.hidden_size // self.num_heads


def _write_causal_tokenizer(dest: Path, spec: _CausalSpec) -> dict[str, int]:
    """Write the tokenizer files of a llama or qwen2 model and return the special token ids."""
    if spec.model_type == "qwen2":
        bpe = _byte_bpe(spec.vocab_size, (), ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
        post: dict[str, Any] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        }
        config: dict[str, Any] = {
            "add_bos_token": False,
            "add_prefix_space": False,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "chat_template": _CHATML_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": spec.max_position_embeddings,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
        special_map: dict[str, Any] = {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": _special_entry("<|im_end|>"),
            "pad_token": _special_entry("<|endoftext|>"),
        }
    else:
        bpe = _byte_bpe(spec.vocab_size, ("<unk>", "<s>", "</s>"), ())
        bos_id = bpe.specials["<s>"]
        template = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<s>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": _template_special("<s>", bos_id)},
        }
        post = {
            "type": "Sequence",
            "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                template,
            ],
        }
        config = {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "chat_template": _LLAMA_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "</s>",
            "legacy": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": spec.max_position_embeddings,
            "pad_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": "<unk>",
        }
        special_map = {
            "bos_token": _special_entry("<s>"),
            "eos_token": _special_entry("</s>"),
            "unk_token": _special_entry("<unk>"),
        }
    config["added_tokens_decoder"] = _added_tokens_decoder(bpe.specials)
    _write_json(dest / "tokenizer.json", _byte_level_tokenizer_json(bpe, post), sort_keys=False, newline=False)
    _write_json(dest / "tokenizer_config.json", config)
    _write_json(dest / "special_tokens_map.json", special_map)
    return bpe.specials


def _causal_shapes(spec: _CausalSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Return the (name, shape) of every weight in state-dict order."""
    hidden = spec.hidden_size
    q_out = spec.num_heads * spec.head_dim
    kv_out = spec.num_kv_heads * spec.head_dim
    with_bias = spec.model_type == "qwen2"
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (spec.vocab_size, hidden))]
    for layer in range(spec.num_layers):
        prefix = f"model.layers.{layer}."
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            shapes.append((f"{prefix}self_attn.{proj}.weight", (out, hidden)))
            if with_bias:
                shapes.append((f"{prefix}self_attn.{proj}.bias", (out,)))
        shapes.append((f"{prefix}self_attn.o_proj.weight", (hidden, q_out)))
        shapes.append((f"{prefix}mlp.gate_proj.weight", (spec.intermediate_size, hidden)))
        shapes.append((f"{prefix}mlp.up_proj.weight", (spec.intermediate_size, hidden)))
        shapes.append((f"{prefix}mlp.down_proj.weight", (hidden, spec.intermediate_size)))
        shapes.append((f"{prefix}input_layernorm.weight", (hidden,)))
        shapes.append((f"{prefix}post_attention_layernorm.weight", (hidden,)))
    shapes.append(("model.norm.weight", (hidden,)))
    if not spec.tie_word_embeddings:
        shapes.append(("lm_head.weight", (spec.vocab_size, hidden)))
    return shapes


def _causal_config(spec: _CausalSpec, specials: dict[str, int]) -> dict[str, Any]:
    """Return config.json as LlamaConfig or Qwen2Config (transformers 4.51) saves it."""
    common: dict[str, Any] = {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "model_type": spec.model_type,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": spec.dtype,
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "vocab_size": spec.vocab_size,
    }
    if spec.model_type == "qwen2":
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "bos_token_id": specials["<|endoftext|>"],
            "eos_token_id": specials["<|im_end|>"],
            "max_window_layers": spec.num_layers,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "use_sliding_window": False,
            **common,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": specials["<s>"],
        "eos_token_id": specials["</s>"],
        "head_dim": spec.head_dim,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_theta": 10000.0,
        **common,
    }


def _generation_config(spec: _CausalSpec, specials: dict[str, int]) -> dict[str, Any]:
    """Return generation_config.json as the real llama / Qwen2 instruct models ship it."""
    if spec.model_type == "qwen2":
        return {
            "bos_token_id": specials["<|endoftext|>"],
            "do_sample": True,
            "eos_token_id": [specials["<|im_end|>"], specials["<|endoftext|>"]],
            "pad_token_id": specials["<|endoftext|>"],
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
            "transformers_version": TRANSFORMERS_VERSION,
        }
    return {
        "_from_model_config": True,
        "bos_token_id": specials["<s>"],
        "eos_token_id": specials["</s>"],
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _write_causal_model(dest: Path, spec: _CausalSpec, groups: list[list[_Tensor]], title: str, seed: int) -> None:
    """Write the config, tokenizer, weights and README of a causal LM directory."""
    specials = _write_causal_tokenizer(dest, spec)
    _write_json(dest / "config.json", _causal_config(spec, specials))
    _write_json(dest / "generation_config.json", _generation_config(spec, specials))
    files = _write_weights(dest, groups)
    data_bytes = sum(t.nbytes for group in groups for t in group)
    architecture = "Qwen2ForCausalLM" if spec.model_type == "qwen2" else "LlamaForCausalLM"
    _write_readme(
        dest,
        title,
        {"library_name": "transformers", "pipeline_tag": "text-generation"},
        [
            f"architecture: `{architecture}` (model_type `{spec.model_type}`), seed {seed}",
            f"hidden_size {spec.hidden_size}, {spec.num_layers} layers, {spec.num_heads} heads "
            f"({spec.num_kv_heads} key/value), intermediate_size {spec.intermediate_size}",
            f"vocab_size {spec.vocab_size}, dtype {spec.dtype}, "
            f"tied embeddings: {'yes' if spec.tie_word_embeddings else 'no'}",
            f"{len(files)} safetensors file(s), {data_bytes} bytes of tensor data",
        ],
    )


def build_tiny_llama(
    dest: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 320,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    shards: int = 1,
    model_type: str = "llama",
) -> Path:
    """Write a tiny random LlamaForCausalLM (or Qwen2ForCausalLM) directory into dest and return it."""
    if model_type not in ("llama", "qwen2"):
        raise ValueError(f"model_type must be 'llama' or 'qwen2', got {model_type!r}")
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_FLOAT_DTYPES)}, got {dtype!r}")
    if min(hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size) <= 0:
        raise ValueError("sizes must be positive")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    spec = _CausalSpec(
        model_type=model_type,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings,
        dtype=dtype,
    )
    if vocab_size < 256 + _CAUSAL_SPECIAL_COUNT:
        raise ValueError(f"vocab_size must be at least {256 + _CAUSAL_SPECIAL_COUNT} (256 bytes + 3 specials)")
    code = _FLOAT_DTYPES[dtype]
    size = _DTYPE_SIZE[code]
    tensors = [
        _Tensor(name, code, shape, math.prod(shape) * size, _encode(_init_values(seed, name, shape), dtype))
        for name, shape in _causal_shapes(spec)
    ]
    groups = _split_even(tensors, shards)
    dest = _prepare_dest(dest)
    _write_causal_model(dest, spec, groups, f"tiny-{model_type}", seed)
    return dest
