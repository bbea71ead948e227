"""Every real tokenizer in llama.cpp's source, through mreg's GGUF, against llama.cpp's own converter.

The vocabularies and the expected ids are llama.cpp's test files, from the llama-cpp-python source package
(tests/support/llama_cpp_source.py): `models/ggml-vocab-NAME.gguf`, written by llama.cpp's converter from the
real model, and `.inp`/`.out`, the ids that model's Hugging Face tokenizer gives for llama.cpp's test strings.
Each vocabulary mreg can describe (15 of 19: byte-level BPE and SentencePiece) is written back as the files its
model ships, on a tiny random Llama (Qwen2 for the Qwen ones). Then:
- the written-back files tokenize every test string to the recorded ids: they are the real tokenizer;
- mreg's GGUF holds exactly the tokenizer keys that llama.cpp's current converter (`convert_hf_to_gguf.py
  --vocab-only`, run on the same checkpoint) writes, key for key and value for value, and the same tokens, scores
  and merges as the vocabulary file;
- llama.cpp, loading mreg's file, tokenizes every test string to the recorded ids;
- the four it cannot describe are listed with the reason, and such tokenizers are refused before any work.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import (
    UNSUPPORTED,
    VOCABS,
    RealVocab,
    build_model,
    cases,
    field,
    pre_tokenizer_table,
    read_vocab,
    reference_vocab_files,
)

from converters.gguf.pretokenizer import _by_structure, known_names, table
from converters.gguf.verify import gguf_reader
from converters.gguf.vocab import BYTE, NORMAL, UNUSED

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

#: Where the pre-tokenizer llama.cpp's converter names today differs from the one in the (older) vocabulary file.
#: gpt-neox's and baichuan's files predate pre-tokenizer names; MPT's and OLMo's tokenizers hash alike and the
#: converter's table lists OLMo last (the last match wins); the qwen35 file carries Qwen2's vocabulary, on which
#: the Qwen3.5 split gives Qwen2's ids for the check text.
PRE_NOW = {"gpt-neox": "olmo", "mpt": "olmo", "qwen35": "qwen2", "baichuan": "default"}
#: The vocabularies converted at Q8_0 (the rest at F16, cheaper: the tokenizer keys do not depend on the type).
Q8_0 = ("llama-spm", "llama-bpe", "qwen2")

#: llama.cpp's converter or tools on real inputs: the slow lane (`-m "not slow"` leaves them out).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sources(llama_cpp_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each vocabulary on its tiny model (built once for the module)."""
    base = tmp_path_factory.mktemp("real-vocab")
    return {name: build_model(read_vocab(llama_cpp_root, name), base / name, dtype="bfloat16") for name in VOCABS}


@pytest.fixture(scope="module")
def reference(llama_cpp_root: Path, sources: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """llama.cpp's converter on every source, in one process (about 40 s on 2 cores)."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return reference_vocab_files(llama_cpp_root, sources, tmp_path_factory.mktemp("reference-vocab"))


def _hf_ids(v: RealVocab, directory: Path) -> Callable[[str], list[int]]:
    """The written-back tokenizer, without special tokens (as llama.cpp recorded the ids)."""
    if v.model == "llama":
        sentencepiece = pytest.importorskip("sentencepiece")
        sp = sentencepiece.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
        return lambda text: list(sp.encode(text))
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def _tokenizer_keys(path: Path) -> dict[str, Any]:
    reader = gguf_reader(path)
    return {k: field(reader, k) for k in reader.fields if k.startswith("tokenizer.")}


def _has_cases(root: Path, name: str) -> bool:
    return (root / "models" / f"ggml-vocab-{name}.gguf.inp").is_file()


@pytest.mark.parametrize("name", list(VOCABS))
def test_real_tokenizer_gives_llama_cpp_converters_file(name: str, llama_cpp_root: Path, sources: dict[str, Path],
                                                        reference: dict[str, Path | str], mreg: Any,
                                                        store_root: Path, tmp_path: Path) -> None:
    import llama_cpp

    v = read_vocab(llama_cpp_root, name)
    src = sources[name]
    expected = cases(llama_cpp_root, name) if _has_cases(llama_cpp_root, name) else []
    hf = _hf_ids(v, src)
    assert [text for text, ids in expected if hf(text) != ids] == []

    convert(mreg, src, "gguf:Q8_0" if name in Q8_0 else "gguf:F16")
    art, out = artifact(store_root, "m", 1, "gguf")
    verification = art["verification"]
    assert verification["status"] == "passed", verification["detail"]
    assert verification["metrics"]["tokenization_mismatches"] == 0
    (path,) = out.glob("*.gguf")
    ours = _tokenizer_keys(path)

    # Key for key what llama.cpp's converter writes for the same checkpoint.
    ref = reference[name]
    assert isinstance(ref, Path), f"llama.cpp's converter failed on {name}: {ref}"
    theirs = _tokenizer_keys(ref)
    assert sorted(ours) == sorted(theirs)
    assert [k for k in theirs if ours[k] != theirs[k]] == []
    assert ours["tokenizer.ggml.pre"] == PRE_NOW.get(name, v.pre)

    # The vocabulary file's tokens, scores and merges; the types of the model's own tokens too. Padding ids the
    # converter now marks UNUSED (older ones, which wrote these files, USER_DEFINED or UNKNOWN), and added tokens
    # it now types by their look (deepseek-coder's `<｜fim▁hole｜>`, Command-R's `<|START_OF_TURN_TOKEN|>`: control)
    # as the key-for-key comparison above holds mreg to.
    assert ours["tokenizer.ggml.tokens"] == v.tokens
    assert ours.get("tokenizer.ggml.merges") == (v.merges or None)
    padding = {i for i, t in enumerate(v.tokens) if t == f"[PAD{i}]"}
    if v.scores:
        scores = ours["tokenizer.ggml.scores"]
        assert [i for i in range(len(v.scores)) if i not in padding and scores[i] != v.scores[i]] == []
    types = ours["tokenizer.ggml.token_type"]
    assert all(types[i] == UNUSED for i in padding)
    own = [i for i, t in enumerate(v.types) if t in (NORMAL, BYTE) and i not in padding]
    assert len(own) > 0.9 * len(v.types)
    assert [i for i in own if types[i] != v.types[i]] == []
    assert field(gguf_reader(path), "general.architecture") == json.loads((src / "config.json").read_text())[
        "model_type"]

    if expected:
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        try:
            got = {text: llm.tokenize(text.encode(), add_bos=False, special=False) for text, _ in expected}
        finally:
            llm.close()
        assert [(text, got[text], ids) for text, ids in expected if got[text] != ids] == []


def test_every_vocabulary_in_llama_cpp_is_covered_or_listed(llama_cpp_root: Path) -> None:
    """No vocabulary file of the pinned llama.cpp is left out silently; the GGUF guide lists the refused ones."""
    files = {p.name[len("ggml-vocab-"):-len(".gguf")] for p in (llama_cpp_root / "models").glob("ggml-vocab-*.gguf")}
    assert files == set(VOCABS) | set(UNSUPPORTED)
    guide = (Path(__file__).parents[3] / "docs" / "guides" / "gguf.md").read_text()
    assert all(f"`{name}`" in guide for name in UNSUPPORTED)


def test_shipped_pre_tokenizer_table_is_llama_cpps(llama_cpp_root: Path) -> None:
    """converters/gguf/data/pre_tokenizers.json is what the pinned llama.cpp's converter holds, hash for hash."""
    parsed = pre_tokenizer_table(llama_cpp_root)
    shipped = table()
    assert shipped["check_text"] == parsed["check_text"]
    assert shipped["hashes"] == parsed["hashes"]
    assert len(known_names()) >= 80 and {"smollm", "deepseek-v3", "tekken", "gpt-4o", "qwen35"} <= set(known_names())


def test_smollm_pre_tokenizer_is_named_without_a_hash() -> None:
    """SmolLM's pre-tokenizer (the report's refused checkpoint), read from its structure alone."""
    doc = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}}
    assert _by_structure(doc) == "smollm"


def test_an_unknown_pre_tokenizer_is_refused_with_its_hash(llama_cpp_root: Path, mreg: Any, store_root: Path,
                                                           tmp_path: Path) -> None:
    """A split regex no family uses, with a hash llama.cpp does not know: refused before any work, naming the
    hash, the closest known families and what to do."""
    pytest.importorskip("tokenizers")
    src = build_model(read_vocab(llama_cpp_root, "llama-bpe"), tmp_path / "odd", dtype="bfloat16")
    doc = json.loads((src / "tokenizer.json").read_text())
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    (src / "tokenizer.json").write_text(json.dumps(doc))
    result = mreg("convert", str(src), "--to", "gguf:F16", "--name", "m", "--json")
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "not one llama.cpp knows" in error["message"] and "check-text hash" in error["message"]
    assert "llama-bpe" in error["hint"]
    assert not (store_root / "models" / "m").exists()


def test_a_wordpiece_tokenizer_is_refused(llama_cpp_root: Path, mreg: Any, store_root: Path, tmp_path: Path) -> None:
    """bert-bge's WordPiece on a decoder: one line saying what is supported, nothing published."""
    v = read_vocab(llama_cpp_root, "llama-bpe")
    src = build_model(v, tmp_path / "wp", dtype="bfloat16")
    doc = json.loads((src / "tokenizer.json").read_text())
    doc["model"] = {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                    "max_input_chars_per_word": 100, "vocab": doc["model"]["vocab"]}
    doc["pre_tokenizer"] = {"type": "BertPreTokenizer"}
    (src / "tokenizer.json").write_text(json.dumps(doc))
    result = mreg("convert", str(src), "--to", "gguf:F16", "--name", "m", "--json")
    assert result.exit_code == 2, result.output
    assert "not a byte-level BPE" in json.loads(result.stdout)["error"]["message"]
    assert not (store_root / "models" / "m").exists()


def test_tekken_pre_tokenizer_is_named_by_its_regex() -> None:
    """Mistral's tekken (Nemo, Pixtral) split regex, read from its structure when the hash is not known."""
    from converters.gguf.pretokenizer import SPLIT_REGEXES

    (regex,) = [r for r, name in SPLIT_REGEXES.items() if name == "tekken"]
    doc = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}
    assert _by_structure(doc) == "tekken"
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = regex.replace(r"\p{N}", r"\p{N}{1,3}")
    assert _by_structure(doc) is None


def test_a_sentencepiece_message_reads_the_same_in_any_layout() -> None:
    """The in-place read of the usual piece layout and the general protobuf reader agree: fields reordered,
    repeated (the last wins), a piece of 128+ bytes, a two-byte type, an unknown field."""
    import struct

    from converters.gguf.vocab import CONTROL, _piece

    def field(number: int, wire: int, payload: bytes) -> bytes:
        key, out = number << 3 | wire, b""
        for v in (key, len(payload)) if wire == 2 else (key,):
            while v >= 0x80:
                out, v = out + bytes([v & 0x7F | 0x80]), v >> 7
            out += bytes([v])
        return out + payload

    piece, score = field(1, 2, "▁the".encode()), field(2, 5, struct.pack("<f", -3.5))
    control = field(3, 0, b"") + bytes([CONTROL])
    long = "x" * 200
    cases = {
        piece + score + control: ("▁the", -3.5, CONTROL),
        piece + score: ("▁the", -3.5, NORMAL),
        score + piece + control: ("▁the", -3.5, CONTROL),
        piece + score + field(1, 2, b"<s>") + control: ("<s>", -3.5, CONTROL),
        field(1, 2, long.encode()) + score: (long, -3.5, NORMAL),
        piece + score + field(3, 0, b"") + bytes([0xAC, 0x02]): ("▁the", -3.5, 300),
        piece + score + control + field(9, 2, b"extra"): ("▁the", -3.5, CONTROL),
        b"": ("", 0.0, NORMAL),
    }
    for message, expected in cases.items():
        assert _piece(message) == expected, message
