"""Deterministic builders of tiny, loadable Hugging Face model directories for tests.

One module per model family, over what they share; tests import from here:

    tensors.py    safetensors files, byte for byte as safetensors.save_file writes them, and random ones
    base.py       reproducible random weights; a model directory's weight shards, JSON files and model card
    tokenizer.py  the byte-level BPE of the causal models; special-token entries every tokenizer carries
    llama.py      build_tiny_llama: LlamaForCausalLM, or Qwen2ForCausalLM with model_type="qwen2"
    padded.py     build_padded_model: a bfloat16 llama of a given size in bytes
    bert.py       build_tiny_bert: BertModel with a WordPiece tokenizer
    edits.py      rewrite_config, set_value: changes to a directory already built
"""

from __future__ import annotations

from support.tiny_models.base import TRANSFORMERS_VERSION
from support.tiny_models.bert import build_tiny_bert
from support.tiny_models.edits import rewrite_config, set_value
from support.tiny_models.llama import build_tiny_llama
from support.tiny_models.padded import build_padded_model
from support.tiny_models.tensors import (
    TensorData,
    TensorEntry,
    random_safetensors,
    write_random_safetensors,
    write_safetensors,
)

__all__ = [
    "TRANSFORMERS_VERSION",
    "TensorData",
    "TensorEntry",
    "build_padded_model",
    "build_tiny_bert",
    "build_tiny_llama",
    "random_safetensors",
    "rewrite_config",
    "set_value",
    "write_random_safetensors",
    "write_safetensors",
]
