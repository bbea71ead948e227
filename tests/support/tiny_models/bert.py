"""A tiny BertModel with a lower-cased WordPiece tokenizer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from support.tiny_models.base import (
    TRANSFORMERS_VERSION,
    _encode,
    _init_values,
    _prepare_dest,
    _write_json,
    _write_readme,
    _write_weights,
)
from support.tiny_models.tensors import _Tensor
from support.tiny_models.tokenizer import _added_token, _added_tokens_decoder, _template_special

_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_BERT_WORDS = (
    "the of and to in is it that for on with as was this be by are at or from model file test hello world"
    " ##s ##ing ##ed ##er ##ly ##es ##tion ##al ##en ##re ##th ##in"
)


def _bert_vocab(vocab_size: int) -> list[str]:
    """Return a WordPiece vocabulary of exactly vocab_size tokens."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    required = [*_BERT_SPECIALS, *letters, *(f"##{letter}" for letter in letters)]
    if vocab_size < len(required):
        raise ValueError(f"vocab_size must be at least {len(required)}")
    punctuation = [chr(code) for code in range(0x21, 0x7F) if not chr(code).isalnum()]
    digits = [str(digit) for digit in range(10)]
    optional = [*punctuation, *digits, *(f"##{digit}" for digit in digits), *_BERT_WORDS.split()]
    tokens = list(dict.fromkeys([*required, *optional]))[:vocab_size]
    tokens.extend(f"[unused{i}]" for i in range(vocab_size - len(tokens)))
    return tokens


def _bert_shapes(
    hidden: int, layers: int, intermediate: int, vocab: int, positions: int
) -> list[tuple[str, tuple[int, ...]]]:
    """Return the (name, shape) of every BertModel weight in state-dict order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("embeddings.word_embeddings.weight", (vocab, hidden)),
        ("embeddings.position_embeddings.weight", (positions, hidden)),
        ("embeddings.token_type_embeddings.weight", (2, hidden)),
        ("embeddings.LayerNorm.weight", (hidden,)),
        ("embeddings.LayerNorm.bias", (hidden,)),
    ]
    for layer in range(layers):
        prefix = f"encoder.layer.{layer}."
        for part in ("query", "key", "value"):
            shapes.append((f"{prefix}attention.self.{part}.weight", (hidden, hidden)))
            shapes.append((f"{prefix}attention.self.{part}.bias", (hidden,)))
        shapes.extend(
            [
                (f"{prefix}attention.output.dense.weight", (hidden, hidden)),
                (f"{prefix}attention.output.dense.bias", (hidden,)),
                (f"{prefix}attention.output.LayerNorm.weight", (hidden,)),
                (f"{prefix}attention.output.LayerNorm.bias", (hidden,)),
                (f"{prefix}intermediate.dense.weight", (intermediate, hidden)),
                (f"{prefix}intermediate.dense.bias", (intermediate,)),
                (f"{prefix}output.dense.weight", (hidden, intermediate)),
                (f"{prefix}output.dense.bias", (hidden,)),
                (f"{prefix}output.LayerNorm.weight", (hidden,)),
                (f"{prefix}output.LayerNorm.bias", (hidden,)),
            ]
        )
    shapes.extend([("pooler.dense.weight", (hidden, hidden)), ("pooler.dense.bias", (hidden,))])
    return shapes


def _bert_tokenizer_json(vocab: list[str]) -> dict[str, Any]:
    """Return a tokenizers-loadable WordPiece tokenizer.json document for vocab."""
    ids = {token: index for index, token in enumerate(vocab)}

    def seq(special: str, type_id: int) -> dict[str, Any]:
        """Return a TemplateProcessing special-token piece."""
        return {"SpecialToken": {"id": special, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(token, ids[token]) for token in _BERT_SPECIALS],
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None,
            "lowercase": True,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [seq("[CLS]", 0), {"Sequence": {"id": "A", "type_id": 0}}, seq("[SEP]", 0)],
            "pair": [
                seq("[CLS]", 0),
                {"Sequence": {"id": "A", "type_id": 0}},
                seq("[SEP]", 0),
                {"Sequence": {"id": "B", "type_id": 1}},
                seq("[SEP]", 1),
            ],
            "special_tokens": {
                "[CLS]": _template_special("[CLS]", ids["[CLS]"]),
                "[SEP]": _template_special("[SEP]", ids["[SEP]"]),
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": ids,
        },
    }


def build_tiny_bert(
    dest: Path,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 64,
    vocab_size: int = 128,
) -> Path:
    """Write a tiny random BertModel directory with a WordPiece tokenizer into dest and return it."""
    if min(hidden_size, num_layers, num_heads, intermediate_size) <= 0:
        raise ValueError("sizes must be positive")
    if hidden_size % num_heads:
        raise ValueError("hidden_size must divide by num_heads")
    positions = 64
    vocab = _bert_vocab(vocab_size)
    tensors = [
        _Tensor(name, "F32", shape, math.prod(shape) * 4, _encode(_init_values(seed, name, shape), "float32"))
        for name, shape in _bert_shapes(hidden_size, num_layers, intermediate_size, vocab_size, positions)
    ]
    dest = _prepare_dest(dest)
    config = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": positions,
        "model_type": "bert",
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "transformers_version": TRANSFORMERS_VERSION,
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    _write_json(dest / "config.json", config)
    _write_weights(dest, [tensors])
    dest.joinpath("vocab.txt").write_bytes("".join(f"{token}\n" for token in vocab).encode("utf-8"))
    _write_json(dest / "tokenizer.json", _bert_tokenizer_json(vocab), sort_keys=False, newline=False)
    specials = {token: vocab.index(token) for token in _BERT_SPECIALS}
    _write_json(
        dest / "tokenizer_config.json",
        {
            "added_tokens_decoder": _added_tokens_decoder(specials),
            "clean_up_tokenization_spaces": True,
            "cls_token": "[CLS]",
            "do_basic_tokenize": True,
            "do_lower_case": True,
            "mask_token": "[MASK]",
            "model_max_length": positions,
            "never_split": None,
            "pad_token": "[PAD]",
            "sep_token": "[SEP]",
            "strip_accents": None,
            "tokenize_chinese_chars": True,
            "tokenizer_class": "BertTokenizer",
            "unk_token": "[UNK]",
        },
    )
    _write_json(
        dest / "special_tokens_map.json",
        {
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
            "pad_token": "[PAD]",
            "sep_token": "[SEP]",
            "unk_token": "[UNK]",
        },
    )
    _write_readme(
        dest,
        "tiny-bert",
        {"library_name": "transformers", "pipeline_tag": "feature-extraction"},
        [
            f"architecture: `BertModel` (model_type `bert`), seed {seed}",
            f"hidden_size {hidden_size}, {num_layers} layers, {num_heads} heads, intermediate_size {intermediate_size}",
            f"vocab_size {vocab_size} (WordPiece, lower-cased), dtype float32",
            f"1 safetensors file, {sum(t.nbytes for t in tensors)} bytes of tensor data",
        ],
    )
    return dest
