"""Real tokenizers through mreg's GGUF: Llama 2's SentencePiece, Llama 3's and Qwen2's byte-level BPE.

The vocabularies and the expected ids are llama.cpp's own test files, from the llama-cpp-python
source package (tests/support/llama_cpp_source.py): `ggml-vocab-NAME.gguf`, written by llama.cpp's
converter from the real model, and the ids that model's Hugging Face tokenizer gives for llama.cpp's
tokenizer test strings. Each vocabulary is written back as the Hugging Face files the model ships,
on a tiny random model of its architecture, and converted by mreg. Then:
- the written-back files tokenize every test string to the recorded ids: they are the real tokenizer;
- mreg's file holds the same tokenizer model, pre-tokenizer, tokens, scores and merges as llama.cpp's;
- llama.cpp, loading mreg's file, tokenizes every test string to the recorded ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import VOCABS, RealVocab, build_model, cases, field, read_vocab

from converters.gguf.verify import gguf_reader
from converters.gguf.vocab import UNUSED

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")


def _hf_ids(v: RealVocab, directory: Path) -> Callable[[str], list[int]]:
    """The written-back tokenizer, without special tokens (as llama.cpp recorded the ids)."""
    if v.model == "llama":
        sentencepiece = pytest.importorskip("sentencepiece")
        sp = sentencepiece.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
        return lambda text: list(sp.encode(text))
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("name", list(VOCABS))
def test_real_tokenizer_converts_to_the_ids_its_model_gives(name: str, llama_cpp_root: Path, mreg: Any,
                                                            store_root: Path, tmp_path: Path) -> None:
    import llama_cpp

    v = read_vocab(llama_cpp_root, name)
    src = build_model(v, tmp_path / name, dtype="bfloat16")
    expected = cases(llama_cpp_root, name)
    assert len(expected) == 46
    hf = _hf_ids(v, src)
    assert [text for text, ids in expected if hf(text) != ids] == []

    convert(mreg, src, "gguf:Q8_0")
    art, out = artifact(store_root, "m", 1, "gguf")
    verification = art["verification"]
    assert verification["status"] == "passed", verification["detail"]
    assert verification["metrics"]["tokenization_mismatches"] == 0

    (path,) = out.glob("*.gguf")
    ours = gguf_reader(path)
    recorded = {"tokenizer.ggml.model": v.model, "tokenizer.ggml.pre": v.pre, "tokenizer.ggml.tokens": v.tokens,
                "tokenizer.ggml.merges": v.merges or None, "tokenizer.ggml.scores": v.scores or None, **v.specials}
    assert "tokenizer.ggml.bos_token_id" in recorded and "tokenizer.ggml.eos_token_id" in recorded
    for key, value in recorded.items():
        assert field(ours, key) == value, key
    # Ids no tokenizer file names are padding: llama.cpp's converter now marks them UNUSED, as mreg does;
    # this file was written when it marked them USER_DEFINED.
    types = field(ours, "tokenizer.ggml.token_type")
    padding = {i for i, t in enumerate(v.tokens) if t == f"[PAD{i}]"}
    assert len(padding) == (290 if name == "qwen2" else 0), "the check below is not empty where it can be"
    assert all(types[i] == UNUSED for i in padding)
    kept = [i for i in range(len(v.types)) if i not in padding]
    assert [types[i] for i in kept] == [v.types[i] for i in kept]
    config = json.loads((src / "config.json").read_text())
    assert field(ours, "general.architecture") == config["model_type"]

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        got = {text: llm.tokenize(text.encode(), add_bos=False, special=False) for text, _ in expected}
    finally:
        llm.close()
    assert [(text, got[text], ids) for text, ids in expected if got[text] != ids] == []
