"""Tokenizer files: a byte-level BPE learned from a built-in corpus (the llama and qwen2 tokenizers), and the
special-token entries that every tokenizer.json and tokenizer_config.json carries."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_CORPUS = """\
A model registry keeps track of every model that a team trains, downloads or ships. Each entry
records where the weights came from, which files belong to it, and how large they are. When you
pull a model, the registry checks the digest of each file, so a broken download is caught before
it reaches a server. When you push a model, the registry writes the files to the store first and
only then moves the reference, so readers never see a half written directory.

The weights of a language model are stored as tensors. A tensor has a name, a data type and a
shape; the file that holds them starts with a small header that lists every tensor and where its
bytes begin and end. Large models are split into shards, and an index file maps each tensor to
the shard that holds it. The tokenizer turns text into numbers and back again: it learns merges
from text, so that the most common pieces of words become single tokens.

This is the first test of the tiny model. The quick brown fox jumps over the lazy dog, and then
the dog runs after the fox into the forest. There are three models in the store: the first is
small, the second is smaller, and the third is the smallest of them all. It is not trained, and
what it says is only noise, but it loads, it runs, and it is the same every time it is built.
Hello world! How are you today? I am fine, thank you. 1, 2, 3, 4, 5 and 10, 20, 30, 100.
"""

_PRETOKEN_RE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
_MAX_MERGES = 400


@dataclass(frozen=True)
class _ByteBpe:
    """A byte-level BPE vocabulary with its merges and special tokens."""

    vocab: dict[str, int]
    merges: tuple[tuple[str, str], ...]
    specials: dict[str, int]


_PRINTABLE_BYTES = (*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100))


@functools.cache
def _byte_symbols() -> tuple[str, ...]:
    """Return GPT-2's byte-to-unicode table: element b is the symbol for byte b."""
    table = {byte: chr(byte) for byte in _PRINTABLE_BYTES}
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + len(table) - len(_PRINTABLE_BYTES))
    return tuple(table[byte] for byte in range(256))


@functools.cache
def _byte_vocab_order() -> tuple[str, ...]:
    """Return the 256 byte symbols in GPT-2's vocabulary order (printable bytes first)."""
    symbols = _byte_symbols()
    rest = [byte for byte in range(256) if byte not in _PRINTABLE_BYTES]
    return tuple(symbols[byte] for byte in [*_PRINTABLE_BYTES, *rest])


def _merge_word(word: tuple[str, ...], pair: tuple[str, str], merged: str) -> tuple[str, ...]:
    """Return word with every occurrence of pair replaced by merged."""
    out: list[str] = []
    index = 0
    while index < len(word):
        if index + 1 < len(word) and (word[index], word[index + 1]) == pair:
            out.append(merged)
            index += 2
        else:
            out.append(word[index])
            index += 1
    return tuple(out)


@functools.cache
def _learned_merges() -> tuple[tuple[str, str], ...]:
    """Learn byte-level BPE merges from the built-in corpus (most frequent pair, ties by order)."""
    symbols = _byte_symbols()
    counts: dict[tuple[str, ...], int] = {}
    for piece in _PRETOKEN_RE.findall(_CORPUS):
        word = tuple(symbols[byte] for byte in piece.encode("utf-8"))
        counts[word] = counts.get(word, 0) + 1
    words = list(counts.items())
    merges: list[tuple[str, str]] = []
    while len(merges) < _MAX_MERGES:
        pairs: dict[tuple[str, str], int] = {}
        for word, freq in words:
            for pair in itertools.pairwise(word):
                pairs[pair] = pairs.get(pair, 0) + freq
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged = best[0] + best[1]
        words = [(_merge_word(word, best, merged), freq) for word, freq in words]
    return tuple(merges)


def _byte_bpe(vocab_size: int, leading: Sequence[str], trailing: Sequence[str]) -> _ByteBpe:
    """Build a byte-level BPE vocab of at most vocab_size ids with specials before/after it."""
    budget = vocab_size - len(leading) - len(trailing)
    if budget < 256:
        raise ValueError(f"vocab_size must be at least {256 + len(leading) + len(trailing)}")
    vocab: dict[str, int] = {}
    for token in [*leading, *_byte_vocab_order()]:
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []
    for left, right in _learned_merges():
        merged = left + right
        if merged not in vocab:
            if len(vocab) - len(leading) >= budget:
                break
            vocab[merged] = len(vocab)
        merges.append((left, right))
    specials = {token: vocab[token] for token in leading}
    specials.update({token: len(vocab) + offset for offset, token in enumerate(trailing)})
    return _ByteBpe(vocab, tuple(merges), specials)


def _added_token(token: str, token_id: int) -> dict[str, Any]:
    """Return a tokenizer.json added_tokens entry for a special token."""
    return {
        "id": token_id,
        "content": token,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _added_tokens_decoder(specials: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Return tokenizer_config.json's added_tokens_decoder for the special tokens."""
    return {
        str(token_id): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token, token_id in sorted(specials.items(), key=lambda item: item[1])
    }


def _special_entry(token: str) -> dict[str, Any]:
    """Return a special_tokens_map.json entry for token."""
    return {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _byte_level_tokenizer_json(bpe: _ByteBpe, post_processor: dict[str, Any]) -> dict[str, Any]:
    """Return a tokenizers-loadable byte-level BPE tokenizer.json document."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            _added_token(token, token_id) for token, token_id in sorted(bpe.specials.items(), key=lambda item: item[1])
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": bpe.vocab,
            "merges": [f"{left} {right}" for left, right in bpe.merges],
        },
    }


def _template_special(token: str, token_id: int) -> dict[str, Any]:
    """Return a TemplateProcessing special_tokens entry."""
    return {"id": token, "ids": [token_id], "tokens": [token]}
