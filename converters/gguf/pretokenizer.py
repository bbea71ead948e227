"""Which of llama.cpp's pre-tokenizers a byte-level BPE `tokenizer.json` is, named as llama.cpp names it.

llama.cpp cannot run a tokenizer.json: it re-implements each model family's pre-tokenizer (its split regexes,
digit grouping, normalization) and picks one by the name in `tokenizer.ggml.pre`. Its converter finds that name
by encoding a fixed check text and hashing the token ids; a model whose hash it does not know is refused. mreg
does the same with the same table (data/pre_tokenizers.json, parsed from llama.cpp's converter at the pinned
llama-cpp-python version: `python tests/support/llama_cpp_source.py --pre-tokenizers DIR` regenerates it), and
encodes with the `tokenizers` library, which runs the tokenizer.json as transformers' fast tokenizers do.

Two readings back the hash up:
- transformers' Llama-family tokenizers add BOS from `add_bos_token` in tokenizer_config.json rather than from
  the tokenizer.json's post-processor; when the two disagree, the ids with BOS as transformers adds it are
  hashed too;
- without `tokenizers` installed, or for a hash the table lacks, the pre-tokenizer's structure is read: the exact
  split regexes of a few families, and the step sequences whose regexes llama.cpp shares.
A tokenizer neither reading knows is refused, with its hash and the names its structure comes closest to.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from registry.convert.configs import read_object
from registry.errors import UsageError

#: The Split regexes of known byte-level BPE tokenizers -> llama.cpp's pre-tokenizer name.
SPLIT_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "tekken",
}


class UnknownPreTokenizer(UsageError):
    """A tokenizer.json whose pre-tokenizer llama.cpp has no implementation of (under any name mreg knows)."""


@dataclass(frozen=True)
class Detected:
    """The name llama.cpp knows the pre-tokenizer by, and how it was found (recorded in the conversion)."""

    name: str
    how: str  # "hash" (llama.cpp's own method) or "structure"
    hash: str | None


@functools.cache
def table() -> dict[str, Any]:
    """llama.cpp's check text and hash table, as shipped with mreg."""
    text = resources.files("converters.gguf").joinpath("data/pre_tokenizers.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def known_names() -> list[str]:
    """Every pre-tokenizer name llama.cpp's converter can write."""
    return sorted({row["name"] for row in table()["hashes"]})


def _hash(ids: list[int]) -> str:
    # llama.cpp hashes Python's str() of the id list: "[1, 2, 3]".
    return hashlib.sha256(str(ids).encode()).hexdigest()


def _hashes(directory: Path) -> list[str]:
    """The check text's id hash(es) of the tokenizer in `directory`; [] without the tokenizers library."""
    try:
        import tokenizers
    except ImportError:
        return []
    try:
        tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as e:  # tokenizers raises its own Exception subclass for any file it cannot load
        raise UnknownPreTokenizer(f"the tokenizers library cannot load tokenizer.json: {str(e)[:200]}",
                                  hint="check the file is the repository's own (re-pull it)") from e
    ids = list(tok.encode(table()["check_text"]).ids)
    out = [_hash(ids)]
    config = read_object(directory / "tokenizer_config.json") or {}
    bos = config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    bos_id = tok.token_to_id(bos) if isinstance(bos, str) else None
    if bos_id is not None and isinstance(config.get("add_bos_token"), bool):
        with_bos = [bos_id, *ids] if ids[:1] != [bos_id] else ids
        as_transformers = with_bos if config["add_bos_token"] else [i for i in ids[:1] if i != bos_id] + ids[1:]
        if as_transformers != ids:
            out.append(_hash(as_transformers))
    return out


def _steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pre = doc.get("pre_tokenizer") or {}
    return list(pre.get("pretokenizers", [])) if pre.get("type") == "Sequence" else [pre]


def _by_structure(doc: dict[str, Any]) -> str | None:
    """The name read from the pre-tokenizer's steps, for the families whose structure is unambiguous."""
    steps = _steps(doc)
    kinds = [s.get("type") for s in steps]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if kinds == ["ByteLevel"] and byte_level[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"] and not byte_level[0].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        return SPLIT_REGEXES.get(regex) if isinstance(regex, str) else None
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and byte_level[0].get("use_regex", True):
        # SmolLM's (and StarCoder's, Refact's, Command-R's: one regex set in llama.cpp); the hash tells them apart.
        return "smollm"
    return None


def _closest(doc: dict[str, Any]) -> list[str]:
    """Known names whose split regex is nearest this tokenizer's (for the refusal's next step)."""
    regexes = [str((s.get("pattern") or {}).get("Regex", "")) for s in _steps(doc) if s.get("type") == "Split"]
    if not regexes:
        return []
    near = difflib.get_close_matches(regexes[0], list(SPLIT_REGEXES), n=3, cutoff=0.5)
    return [SPLIT_REGEXES[r] for r in near]


def detect(directory: Path, doc: dict[str, Any]) -> Detected:
    """llama.cpp's name for the pre-tokenizer of `directory/tokenizer.json` (`doc`, already parsed)."""
    names = {row["hash"]: row["name"] for row in table()["hashes"]}
    hashes = _hashes(directory)
    for h in hashes:
        if h in names:
            return Detected(names[h], "hash", h)
    structural = _by_structure(doc)
    if structural is not None:
        return Detected(structural, "structure", hashes[0] if hashes else None)
    pre = json.dumps(doc.get("pre_tokenizer"))[:160]
    closest = _closest(doc)
    found = f"check-text hash {hashes[0][:16]}…" if hashes else "no hash (install `tokenizers`)"
    raise UnknownPreTokenizer(
        f"tokenizer.json's pre-tokenizer is not one llama.cpp knows ({found}; pre_tokenizer {pre})",
        hint=(f"closest by structure: {', '.join(closest)}; " if closest else "")
        + "llama.cpp would refuse it too: a newer llama-cpp-python may know it (its convert_hf_to_gguf_update.py "
        "lists the models), or convert to ONNX instead")
