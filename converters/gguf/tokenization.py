"""The reference tokenization of a source: its own tokenizer, configured as its tokenizer_config.json says.

A GGUF file's verification compares llama.cpp's ids with these (and evaluates the reference logits on them).
The settings are read here from the checkpoint, apart from the converter's writing of them, so a setting the
file misses makes llama.cpp tokenize otherwise and the conversion fail instead of publishing:
- a SentencePiece tokenizer.model runs in sentencepiece, with `add_bos_token` (default true), `add_eos_token`
  (default false) and `add_prefix_space` as transformers applies them; `add_prefix_space` replaces the model's
  own dummy prefix (its NormalizerSpec's add_dummy_prefix, overridden in the proto handed to sentencepiece);
- a tokenizer.json runs in the tokenizers library, as transformers' fast tokenizers run it.
transformers itself is not the reference: version 5 builds the tokenizer of a checkpoint that ships only a
tokenizer.model with a Metaspace that adds no dummy prefix before a leading space (`" Hello"` -> `▁H ello`, where
SentencePiece, and llama.cpp, give `▁ ▁H ello`); the tests hold this reference equal to transformers elsewhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.convert.configs import read_object


@dataclass(frozen=True)
class Reference:
    """A text -> ids function and what it is; `encode` None: nothing here can tokenize (`label` says why)."""

    encode: Callable[[str], list[int]] | None
    label: str


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _flag(config: dict[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    return value if isinstance(value, bool) else default


def with_dummy_prefix(raw: bytes, prefix: bool) -> bytes:
    """A SentencePiece model (tokenizer.model's bytes) whose NormalizerSpec says add_dummy_prefix=`prefix`.

    A second occurrence of a message field is merged into the first by every protobuf parser, its scalars
    winning: appending `normalizer_spec {add_dummy_prefix: prefix}` (field 3 in field 3) changes that one setting.
    """
    return raw + bytes((0x1A, 0x02, 0x18, int(prefix)))


def _sentencepiece(directory: Path, config: dict[str, Any]) -> Reference | None:
    from converters.gguf.vocab import dummy_prefix

    sentencepiece = _module("sentencepiece")
    if sentencepiece is None:
        return None
    raw = (directory / "tokenizer.model").read_bytes()
    prefix = config.get("add_prefix_space")
    if isinstance(prefix, bool) and prefix != dummy_prefix(raw):
        raw = with_dummy_prefix(raw, prefix)
    sp = sentencepiece.SentencePieceProcessor(model_proto=raw)
    add_bos, add_eos = _flag(config, "add_bos_token", True), _flag(config, "add_eos_token", False)
    bos = [sp.bos_id()] if add_bos and sp.bos_id() >= 0 else []
    eos = [sp.eos_id()] if add_eos and sp.eos_id() >= 0 else []
    settings = f"add_bos_token={add_bos}, add_eos_token={add_eos}, dummy prefix {dummy_prefix(raw)}".lower()
    return Reference(lambda s: [*bos, *sp.encode(s), *eos], f"sentencepiece, {settings}")


def reference(directory: Path) -> Reference:
    """The source's tokenizer as its checkpoint configures it (tokenizer.model first, as llama.cpp's converter)."""
    config = read_object(directory / "tokenizer_config.json") or {}
    if (directory / "tokenizer.model").is_file():
        spm = _sentencepiece(directory, config)
        if spm is not None:
            return spm
    if (directory / "tokenizer.json").is_file():
        tokenizers = _module("tokenizers")
        if tokenizers is not None:
            tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
            return Reference(lambda s: list(tok.encode(s, add_special_tokens=True).ids), "the tokenizers library")
    return Reference(None, "no tokenizer library (pip install 'mreg[gguf]': tokenizers, sentencepiece)")
