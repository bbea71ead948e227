"""The tokenizer of a Hugging Face snapshot as GGUF metadata (what llama.cpp's vocab loader reads).

Two kinds: SentencePiece (`tokenizer.model`, read here with a small protobuf reader so that no
sentencepiece install is needed) and byte-level BPE (`tokenizer.json`), whose pre-tokenizer is
recognized from its structure and regex. Special token ids, add-bos/eos flags and merges come
from gguf's `SpecialVocab`, the same reader llama.cpp's converter uses; the chat templates are read
as transformers reads them (`chat_templates`), verbatim.
Anything else is refused with the reason, before a byte is written.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import UsageError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

#: The Split regexes of known byte-level BPE tokenizers -> llama.cpp's pre-tokenizer name.
_SPLIT_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
}

#: SpecialVocab's token kinds -> the middle of their GGUF key (llama.cpp spells "seperator" so).
_ID_KEYS = {"bos": "bos", "eos": "eos", "eot": "eot", "eom": "eom", "unk": "unknown", "sep": "seperator",
            "pad": "padding", "mask": "mask"}


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
    merges: list[str] = field(default_factory=list)
    special_ids: dict[str, int] = field(default_factory=dict)
    add_special: dict[str, bool] = field(default_factory=dict)
    chat_template: str | None = None
    #: Other templates by name (`tool_use`, ...), stored as llama.cpp's converter stores them.
    named_chat_templates: dict[str, str] = field(default_factory=dict)
    add_space_prefix: bool | None = None

    def metadata(self) -> Iterator[tuple[str, Any]]:
        """The tokenizer.* keys with their values (lists stay lists)."""
        yield "tokenizer.ggml.model", self.model
        yield "tokenizer.ggml.pre", self.pre
        yield "tokenizer.ggml.tokens", self.tokens
        if self.scores is not None:
            yield "tokenizer.ggml.scores", self.scores
        yield "tokenizer.ggml.token_type", self.types
        if self.merges:
            yield "tokenizer.ggml.merges", self.merges
        for typ, tid in sorted(self.special_ids.items()):
            if typ in _ID_KEYS:
                yield f"tokenizer.ggml.{_ID_KEYS[typ]}_token_id", tid
        for typ, flag in sorted(self.add_special.items()):
            if typ in ("bos", "eos", "sep"):
                yield f"tokenizer.ggml.add_{typ}_token", flag
        if self.add_space_prefix is not None:
            yield "tokenizer.ggml.add_space_prefix", self.add_space_prefix
        if self.chat_template is not None:
            yield "tokenizer.chat_template", self.chat_template
        names = {_template_key(name): text for name, text in self.named_chat_templates.items()}
        for name, text in sorted(names.items()):
            yield f"tokenizer.chat_template.{name}", text
        if names:
            yield "tokenizer.chat_templates", sorted(names)


def _template_key(name: str) -> str:
    """A template's name as a GGUF key part: llama.cpp's writer keeps letters and digits, the rest becomes `_`."""
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name)


def _looks_special(text: str) -> bool:
    """Added tokens some models forget to mark special (llama.cpp's converter treats them as control)."""
    return text in ("<pad>", "<mask>") or (text.startswith("<|") and text.endswith("|>"))


def _pre_tokenizer(doc: dict[str, Any]) -> str:
    """llama.cpp's name for the pre-tokenizer of a byte-level BPE tokenizer.json."""
    pre = doc.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers", [])
        splits = [s for s in steps if s.get("type") == "Split"]
        levels = [s for s in steps if s.get("type") == "ByteLevel" and not s.get("use_regex", True)]
        if len(splits) == 1 and len(levels) == 1 and len(steps) == 2:
            regex = splits[0].get("pattern", {}).get("Regex")
            if regex in _SPLIT_REGEXES:
                return _SPLIT_REGEXES[regex]
            raise UnsupportedTokenizer(f"tokenizer.json splits with an unknown regex {regex!r}",
                                       hint=f"known pre-tokenizers: {', '.join(sorted(_SPLIT_REGEXES.values()))}")
    raise UnsupportedTokenizer(f"tokenizer.json has an unsupported pre_tokenizer {json.dumps(pre)[:200]}",
                               hint="supported: byte-level BPE (gpt-2, llama-bpe, qwen2) and SentencePiece")


def _bpe(directory: Path, vocab_size: int) -> Vocab:
    """A byte-level BPE tokenizer.json (GPT-2 style, as Qwen and Llama 3 ship)."""
    doc = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    model = doc.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or (doc.get("decoder") or {}).get("type") not in (
        "ByteLevel", None
    ):
        raise UnsupportedTokenizer("tokenizer.json is not a byte-level BPE tokenizer",
                                   hint="supported: byte-level BPE tokenizer.json, or a SentencePiece tokenizer.model")
    pre = _pre_tokenizer(doc)
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    for added in doc.get("added_tokens", []):
        text = added["content"]
        special = added.get("special") or _looks_special(text)
        by_id[added["id"]] = (text, CONTROL if special else USER_DEFINED)
    size = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED))[0] for i in range(size)]
    types = [by_id.get(i, ("", UNUSED))[1] for i in range(size)]
    vocab = Vocab(model="gpt2", pre=pre, tokens=tokens, types=types)
    _special(directory, vocab, load_merges=True)
    if not vocab.merges:
        raise UnsupportedTokenizer("tokenizer.json has no merges", hint="a BPE tokenizer needs its merges")
    return vocab


def _special(directory: Path, vocab: Vocab, load_merges: bool) -> None:
    """Special ids, add flags, merges and chat template, read as llama.cpp's converter reads them."""
    import logging

    import gguf

    # SpecialVocab logs warnings about odd templates; the library must not print.
    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)
    special = gguf.SpecialVocab(directory, load_merges=load_merges, n_vocab=len(vocab.tokens))
    vocab.merges = list(special.merges)
    vocab.special_ids = dict(special.special_token_ids)
    vocab.add_special = dict(special.add_special_token)
    templates = chat_templates(directory)
    vocab.chat_template = templates.pop("default", None)
    vocab.named_chat_templates = templates


def chat_templates(directory: Path) -> dict[str, str]:
    """The snapshot's chat templates by name, read as transformers 5's tokenizer reads them.

    `chat_template.jinja` and `additional_chat_templates/NAME.jinja`, when any exists, replace the
    `chat_template` of tokenizer_config.json (a string, the default, or a list of {name, template});
    gguf's SpecialVocab does the opposite (the config wins) and ignores the files when the config is
    missing, so the GGUF file would carry another template than the one transformers renders with.
    `chat_template.json` (where processors keep it) is read last, as llama.cpp's converter reads it.
    Files are read as text, as transformers reads them: the template is what its tokenizer holds.
    """
    found: dict[str, str] = {}
    default, extra = directory / "chat_template.jinja", directory / "additional_chat_templates"
    if default.is_file():
        found["default"] = default.read_text(encoding="utf-8")
    if extra.is_dir():
        found.update((p.name.removesuffix(".jinja"), p.read_text(encoding="utf-8"))
                     for p in sorted(extra.glob("*.jinja")) if p.is_file())
    if found:
        return found
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = directory / name
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template") if path.is_file() else None
        if isinstance(template, str):
            return {"default": template}
        if isinstance(template, list):
            return {t["name"]: t["template"] for t in template
                    if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)}
    return {}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
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


def _sentencepiece(directory: Path, vocab_size: int) -> Vocab:
    """A SentencePiece tokenizer.model (Llama 2, Mistral): pieces, scores and types from its ModelProto."""
    raw = (directory / "tokenizer.model").read_bytes()
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    add_dummy_prefix = True
    try:
        for number, _, value in _fields(raw):
            if number == 1:  # SentencePiece {1: piece, 2: score, 3: type}
                piece, score, kind = "", 0.0, NORMAL
                for n, _, v in _fields(value):
                    if n == 1:
                        piece = v.decode("utf-8")
                    elif n == 2:
                        score = struct.unpack("<f", v)[0]
                    elif n == 3:
                        kind = v
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
    config = directory / "tokenizer_config.json"
    decoder = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder", {}) if config.is_file() else {}
    size = max(vocab_size, len(tokens))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    scores += [-1000.0] * (size - len(scores))
    types += [UNUSED] * (size - len(types))
    for key, data in decoder.items():
        tid = int(key)
        if tid < size:
            text = data["content"]
            special = data.get("special") or _looks_special(text)
            tokens[tid] = text if special else text.replace("\u2581", " ")
            types[tid] = CONTROL if special else USER_DEFINED
            scores[tid] = -1000.0
    vocab = Vocab(model="llama", pre="default", tokens=tokens, types=types, scores=scores,
                  add_space_prefix=None if add_dummy_prefix else False)
    _special(directory, vocab, load_merges=False)
    if "unk" not in vocab.special_ids and UNKNOWN in types:
        # Found by name in tokenizer.json when the repository ships one; the model itself marks its piece.
        vocab.special_ids["unk"] = types.index(UNKNOWN)
    return vocab


def load_vocab(directory: Path, vocab_size: int) -> Vocab:
    """The tokenizer in `directory`, preferring tokenizer.model as llama.cpp's converter does."""
    if (directory / "tokenizer.model").is_file():
        return _sentencepiece(directory, vocab_size)
    if (directory / "tokenizer.json").is_file():
        return _bpe(directory, vocab_size)
    raise UnsupportedTokenizer("the snapshot has neither tokenizer.model nor tokenizer.json",
                               hint="GGUF embeds the tokenizer: pull the repository with its tokenizer files")
