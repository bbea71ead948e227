"""The tokenizer of a Hugging Face snapshot as GGUF metadata (what llama.cpp's vocab loader reads).

Two kinds: SentencePiece (`tokenizer.model`, read with a small protobuf reader: no sentencepiece
install needed) and byte-level BPE (`tokenizer.json`), whose pre-tokenizer is named as llama.cpp's
converter names it (converters/gguf/pretokenizer.py). Special token ids, add-BOS/EOS flags, merges
and chat templates are read as llama.cpp's converter reads them (converters/gguf/special.py).
Anything else is refused with the reason, before a byte is written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from converters.gguf.pretokenizer import Detected, detect
from converters.gguf.special import Special, read_special
from registry.convert.configs import InvalidConfig, read_object
from registry.errors import UsageError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

class UnsupportedTokenizer(UsageError):
    """The snapshot's tokenizer is of a kind this converter cannot describe to llama.cpp."""


@dataclass
class Vocab:
    """Everything llama.cpp needs about a tokenizer, as GGUF key/value pairs."""

    model: str
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    special: Special = field(default_factory=Special)
    add_space_prefix: bool | None = None
    #: How a BPE tokenizer's pre-tokenizer name was found (recorded with the conversion).
    pre_detected: Detected | None = None

    @property
    def chat_template(self) -> str | None:
        """The default chat template (stored verbatim, with any named ones, in the file)."""
        return self.special.default_template()

    def metadata(self) -> Iterator[tuple[str, Any]]:
        """The tokenizer.* keys with their values (lists stay lists), as llama.cpp's converter writes them."""
        yield "tokenizer.ggml.model", self.model
        yield "tokenizer.ggml.pre", self.pre
        yield "tokenizer.ggml.tokens", self.tokens
        if self.scores is not None:
            yield "tokenizer.ggml.scores", self.scores
        yield "tokenizer.ggml.token_type", self.types
        if self.add_space_prefix is not None:
            yield "tokenizer.ggml.add_space_prefix", self.add_space_prefix
        yield from self.special.metadata()


def _looks_special(text: str) -> bool:
    """Added tokens some models forget to mark special, which llama.cpp's converter types as control anyway:
    deepseek-coder's `<pad>` and full-width `<｜…｜>`, Gemma's `<mask>`, `<2mass>`, `[@BOS@]` and `<unused…>`,
    and any `<|…|>`."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _bpe(directory: Path, vocab_size: int, config: dict[str, Any] | None) -> Vocab:
    """A byte-level BPE tokenizer.json (GPT-2 style, as Qwen and Llama 3 ship)."""
    doc = read_object(directory / "tokenizer.json") or {}
    model = doc.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or (doc.get("decoder") or {}).get("type") not in (
        "ByteLevel", None
    ):
        raise UnsupportedTokenizer("tokenizer.json is not a byte-level BPE tokenizer",
                                   hint="supported: byte-level BPE tokenizer.json, or a SentencePiece tokenizer.model")
    vocab_map, added_tokens = model.get("vocab"), doc.get("added_tokens") or []
    if not isinstance(vocab_map, dict) or not isinstance(added_tokens, list):
        raise InvalidConfig("tokenizer.json", "has no vocab object or no added_tokens list")
    # Every id is bounded before a list is sized by it: the vocabulary holds `vocab_size` rows (config.json,
    # checked against the embedding's rows) or as many tokens as the file lists, whichever is more; an id past
    # that names a row no weight holds, and would size the token lists from a number (10**12: 21.8 GB).
    limit = max(vocab_size, len(vocab_map) + len(added_tokens))
    by_id: dict[int, tuple[str, int]] = {_token_id(i, t, limit): (t, NORMAL) for t, i in vocab_map.items()}
    for added in added_tokens:
        if not isinstance(added, dict) or not isinstance(added.get("content"), str):
            raise InvalidConfig("tokenizer.json", f"has an added token that is not an id with a content: "
                                                  f"{str(added)[:80]!r}")
        text = added["content"]
        special = added.get("special") or _looks_special(text)
        by_id[_token_id(added.get("id"), text, limit)] = (text, CONTROL if special else USER_DEFINED)
    size = max(vocab_size, max(by_id, default=-1) + 1)
    detected = detect(directory, doc)  # after the ids are bounded: it may hand the file to the tokenizers library
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED))[0] for i in range(size)]
    types = [by_id.get(i, ("", UNUSED))[1] for i in range(size)]
    vocab = Vocab(model="gpt2", pre=detected.name, tokens=tokens, types=types, pre_detected=detected)
    vocab.special = read_special(directory, len(tokens), load_merges=True, tokenizer=doc, model_config=config)
    if not vocab.special.merges:
        raise UnsupportedTokenizer("tokenizer.json has no merges", hint="a BPE tokenizer needs its merges")
    return vocab


def _token_id(value: object, text: str, limit: int) -> int:
    """A token id of tokenizer.json, or InvalidConfig when it is not a whole number below `limit`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise InvalidConfig("tokenizer.json", f"gives token {text[:40]!r} the id {str(value)[:40]}, not one of the "
                                              f"{limit} ids of its vocabulary")
    return value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    if buf[pos] < 0x80:  # one byte: field keys, and most lengths
        return buf[pos], pos + 1
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise UnsupportedTokenizer(f"tokenizer.model: unsupported protobuf wire type {wire}")
        yield number, wire, value


def _piece(value: bytes) -> tuple[str, float, int]:
    """One SentencePiece message: (piece, score, type), the last of each field winning, as protobuf reads it.

    The layout every trainer writes (piece of under 128 bytes, score, then a one-byte type or none) is read
    in place; any other goes through the general reader. Llama 2's 32 K pieces: 0.03 s against 0.08 (the whole
    vocabulary read, `load_vocab`: 0.06 s, was 0.25).
    """
    size = len(value)
    if size > 1 and value[0] == 0x0A and value[1] < 0x80:
        end = 2 + value[1]
        if end + 5 <= size and value[end] == 0x15:  # field 2, 32-bit
            tail = size - end - 5
            if tail == 0 or (tail == 2 and value[end + 5] == 0x18 and value[end + 6] < 0x80):
                kind = value[end + 6] if tail else NORMAL
                return value[2:end].decode("utf-8"), struct.unpack_from("<f", value, end + 1)[0], kind
    piece, score, kind = "", 0.0, NORMAL
    for n, _, v in _fields(value):
        if n == 1:
            piece = v.decode("utf-8")
        elif n == 2:
            score = struct.unpack("<f", v)[0]
        elif n == 3:
            kind = v
    return piece, score, kind


def dummy_prefix(raw: bytes) -> bool:
    """Whether a SentencePiece model (the tokenizer.model's bytes) prepends a space to the text (its
    NormalizerSpec's add_dummy_prefix, true unless the model says otherwise)."""
    found = True
    try:
        for number, _, value in _fields(raw):
            if number == 3:  # NormalizerSpec {3: add_dummy_prefix}; the last of a field wins, as protobuf reads it
                for n, _, v in _fields(value):
                    if n == 3:
                        found = bool(v)
    except (IndexError, struct.error) as e:
        raise UnsupportedTokenizer(f"tokenizer.model is not a SentencePiece model: {e}") from e
    return found


def _sentencepiece(directory: Path, vocab_size: int, config: dict[str, Any] | None) -> Vocab:
    """A SentencePiece tokenizer.model (Llama 2, Mistral): pieces, scores and types from its ModelProto."""
    raw = (directory / "tokenizer.model").read_bytes()
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    add_dummy_prefix = True
    try:
        for number, _, value in _fields(raw):
            if number == 1:  # SentencePiece {1: piece, 2: score, 3: type}
                piece, score, kind = _piece(value)
                tokens.append(piece)
                scores.append(score)
                types.append(kind if kind in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE) else NORMAL)
            elif number == 3:  # NormalizerSpec {3: add_dummy_prefix}
                for n, _, v in _fields(value):
                    if n == 3:
                        add_dummy_prefix = bool(v)
    except (IndexError, UnicodeDecodeError, struct.error) as e:
        raise UnsupportedTokenizer(f"tokenizer.model is not a SentencePiece model: {e}") from e
    if not tokens:
        raise UnsupportedTokenizer("tokenizer.model holds no pieces")
    decoder = (read_object(directory / "tokenizer_config.json") or {}).get("added_tokens_decoder") or {}
    added = read_object(directory / "added_tokens.json") or {}
    size = max(vocab_size, len(tokens))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    scores += [-10000.0] * (size - len(scores))  # llama.cpp's converter's score for ids no piece or token names
    types += [UNUSED] * (size - len(types))
    # added_tokens.json (older repositories) first, then tokenizer_config.json's added tokens, as llama.cpp does.
    for text, tid in added.items():
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise UnsupportedTokenizer(f"added_tokens.json maps {text!r} to {tid!r}, not a token id",
                                       hint="re-pull the repository")
        if tid < size:
            tokens[tid], scores[tid], types[tid] = text, -1000.0, USER_DEFINED
    if not isinstance(decoder, dict):
        raise UnsupportedTokenizer("tokenizer_config.json's added_tokens_decoder is not an object",
                                   hint="re-pull the repository")
    for key, data in decoder.items():
        # ASCII digits only, and few of them: int() takes "²" or 5,000 digits only to fail or to build a huge number.
        if not (key.isascii() and key.isdigit() and len(key) <= 18) or not isinstance(data, dict) \
                or not isinstance(data.get("content"), str):
            raise UnsupportedTokenizer(f"tokenizer_config.json's added token {key!r} is not an id with a content",
                                       hint="re-pull the repository")
        tid = int(key)
        if tid < size:
            text = data["content"]
            special = data.get("special") or _looks_special(text)
            tokens[tid] = text if special else text.replace("\u2581", " ")
            types[tid] = CONTROL if special else USER_DEFINED
            scores[tid] = -1000.0
    vocab = Vocab(model="llama", pre="default", tokens=tokens, types=types, scores=scores,
                  add_space_prefix=None if add_dummy_prefix else False)
    vocab.special = read_special(directory, len(tokens), load_merges=False, model_config=config)
    return vocab


def load_vocab(directory: Path, vocab_size: int, config: dict[str, Any] | None = None) -> Vocab:
    """The tokenizer in `directory`, preferring tokenizer.model as llama.cpp's converter does (`config`: the
    model's config.json when already read)."""
    if (directory / "tokenizer.model").is_file():
        return _sentencepiece(directory, vocab_size, config)
    if (directory / "tokenizer.json").is_file():
        return _bpe(directory, vocab_size, config)
    raise UnsupportedTokenizer("the snapshot has neither tokenizer.model nor tokenizer.json",
                               hint="GGUF embeds the tokenizer: pull the repository with its tokenizer files")
