"""The reference tokenization of a source: its tokenizer as transformers configures it from the checkpoint.

A GGUF file's verification compares llama.cpp's ids with these (and evaluates the reference logits on them), so
a tokenizer setting the converter misses (tokenizer_config.json's `add_bos_token`, `add_eos_token`,
`add_prefix_space`, …) makes the conversion fail instead of publishing. transformers is the reference where it
is installed. Without it, the tokenizers library (tokenizer.json) or sentencepiece (tokenizer.model) tokenize,
with tokenizer_config.json's add-BOS/EOS flags applied to a tokenizer.model as transformers applies them; a
tokenizer.model whose `add_prefix_space` contradicts its own dummy prefix cannot be tokenized so without
transformers (which rewrites the model's normalizer), and is then not compared: the verification says so.
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
    """A text -> ids function and what it is; `encode` None: nothing here can tokenize as configured (`label`
    says why)."""

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


def _transformers(directory: Path) -> Reference | str:
    transformers = _module("transformers")
    if transformers is None:
        return "transformers is not installed"
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as e:  # noqa: BLE001  (transformers raises many types for a tokenizer it cannot build)
        return f"transformers cannot load the tokenizer ({type(e).__name__}: {str(e).strip()[:120]})"
    return Reference(lambda s: list(tok(s)["input_ids"]), f"transformers {transformers.__version__}")


def _sentencepiece(directory: Path, config: dict[str, Any], why: str) -> Reference | None:
    from converters.gguf.vocab import dummy_prefix

    sentencepiece = _module("sentencepiece")
    if sentencepiece is None:
        return None
    path = directory / "tokenizer.model"
    prefix = config.get("add_prefix_space")
    if isinstance(prefix, bool) and prefix != dummy_prefix(path.read_bytes()):
        return Reference(None, f"tokenizer_config.json's add_prefix_space={str(prefix).lower()} overrides the "
                               "tokenizer.model's dummy prefix, which only transformers applies (install it)")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    bos = [sp.bos_id()] if _flag(config, "add_bos_token", True) and sp.bos_id() >= 0 else []
    eos = [sp.eos_id()] if _flag(config, "add_eos_token", False) and sp.eos_id() >= 0 else []
    return Reference(lambda s: [*bos, *sp.encode(s), *eos],
                     f"sentencepiece with tokenizer_config.json's add_bos_token/add_eos_token ({why})")


def reference(directory: Path) -> Reference:
    """The source's tokenizer as transformers configures it, or the closest the installed libraries come."""
    found = _transformers(directory)
    if isinstance(found, Reference):
        return found
    config = read_object(directory / "tokenizer_config.json") or {}
    if (directory / "tokenizer.model").is_file():
        spm = _sentencepiece(directory, config, found)
        if spm is not None:
            return spm
    if (directory / "tokenizer.json").is_file():
        tokenizers = _module("tokenizers")
        if tokenizers is not None:
            tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
            return Reference(lambda s: list(tok.encode(s, add_special_tokens=True).ids),
                             f"the tokenizers library ({found})")
    return Reference(None, f"no tokenizer library ({found}; nor tokenizers/sentencepiece)")
