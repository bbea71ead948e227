"""SentencePiece beyond Llama 2: Gemma's and Mistral v3's layouts, trained on the spot, through mreg's GGUF.

Gemma's tokenizer.model adds no dummy prefix and carries user-defined pieces (`<start_of_turn>`); Mistral v3's
carries control pieces (`[INST]`, `[/INST]`) in the model itself. Each goes on a tiny Llama; mreg's file must
hold the tokenizer keys llama.cpp's converter writes for the same checkpoint (but for two, where llama.cpp's own
file would tokenize Gemma's layout wrongly: shown below), and llama.cpp must tokenize the test strings in it
exactly as SentencePiece does.
Phi-3's layout (added tokens past the pieces, `</s>` not special) is one of the real vocabularies in
test_real_vocab.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import field, reference_vocab_files
from support.tiny_models import build_tiny_llama

from converters.gguf.verify import gguf_reader

pytest.importorskip("llama_cpp")
spm = pytest.importorskip("sentencepiece")

CORPUS = [
    "Hello world! How are you today? I am fine, thank you.",
    "<start_of_turn>user\nWhat is a model registry?<end_of_turn>\n<start_of_turn>model\n",
    "[INST] Write a haiku about version control. [/INST] Commits fall like leaves",
    "1, 2, 3 and 10, 20, 30, 12345. don't won't it's über café naïve — 日本語",
]

#: name -> (trainer options, tokenizer_config.json entries).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gemma": ({"add_dummy_prefix": False, "user_defined_symbols": ["<start_of_turn>", "<end_of_turn>"],
               "pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3},
              {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
               "add_bos_token": True, "add_eos_token": False}),
    "mistral-v3": ({"add_dummy_prefix": True, "control_symbols": ["[INST]", "[/INST]"],
                    "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1},
                   {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                    "add_eos_token": False, "legacy": False}),
}


def _build(dest: Path, name: str) -> Path:
    options, tokenizer_config = VARIANTS[name]
    names = {"pad_piece": "<pad>", "eos_piece": "<eos>", "bos_piece": "<bos>", "unk_piece": "<unk>"} \
        if name == "gemma" else {}
    build_tiny_llama(dest, vocab_size=421 if name == "mistral-v3" else 420)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 30), model_writer=model, vocab_size=420, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, hard_vocab_limit=False, minloglevel=2,
        allow_whitespace_only_pieces=True, **options, **names)
    (dest / "tokenizer.model").write_bytes(model.getvalue())
    (dest / "tokenizer.json").unlink()
    size = spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
    (dest / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer",
                                                            **tokenizer_config}, indent=2))
    if name == "mistral-v3":  # an older repository's added_tokens.json: one token past the pieces
        assert size == 420
        (dest / "added_tokens.json").write_text(json.dumps({"<extra_id_0>": size}))
        size += 1
    config = json.loads((dest / "config.json").read_text())
    config.update(vocab_size=size, bos_token_id=options["bos_id"], eos_token_id=options["eos_id"])
    config.pop("pad_token_id", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


@pytest.fixture(scope="module")
def built(llama_cpp_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path | str]]:
    pytest.importorskip("transformers")
    base = tmp_path_factory.mktemp("spm-variants")
    sources = {name: _build(base / name, name) for name in VARIANTS}
    refs = reference_vocab_files(llama_cpp_root, sources, base / "reference")
    return {name: (sources[name], refs[name]) for name in VARIANTS}


def _keys(path: Path) -> dict[str, Any]:
    reader = gguf_reader(path)
    return {k: field(reader, k) for k in reader.fields if k.startswith("tokenizer.")}


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.slow
def test_sentencepiece_layout_gives_llama_cpp_converters_keys(name: str, built: dict[str, tuple[Path, Path | str]],
                                                              mreg: Any, store_root: Path) -> None:
    src, ref = built[name]
    assert isinstance(ref, Path), f"llama.cpp's converter failed: {ref}"
    convert(mreg, src, "gguf:F16")
    art, out = artifact(store_root, "m", 1, "gguf")
    assert art["verification"]["status"] == "passed", art["verification"]["detail"]
    assert art["verification"]["metrics"]["tokenization_mismatches"] == 0
    (path,) = out.glob("*.gguf")
    ours, theirs = _keys(path), _keys(ref)
    # Two deliberate differences, both where llama.cpp's generic SentencePiece path (a Llama-architecture model)
    # would tokenize otherwise than SentencePiece: it writes no add_space_prefix for a model without a dummy
    # prefix (llama.cpp then adds one), and types user-defined pieces NORMAL (llama.cpp then splits them).
    differ = {"tokenizer.ggml.add_space_prefix", "tokenizer.ggml.token_type"} if name == "gemma" else set()
    assert sorted(set(ours) - differ) == sorted(set(theirs) - differ)
    assert [k for k in theirs if k not in differ and ours[k] != theirs[k]] == []
    sp = spm.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
    expected = {text: list(sp.encode(text)) for text in CORPUS}
    assert _llama_ids(path, special=name == "gemma") == expected
    if name == "gemma":
        assert ours["tokenizer.ggml.add_space_prefix"] is False
        tokens, types, their_types = ours["tokenizer.ggml.tokens"], ours["tokenizer.ggml.token_type"], theirs[
            "tokenizer.ggml.token_type"]
        user = [i for i, t in enumerate(types) if t != their_types[i]]
        assert [tokens[i] for i in user] == ["<start_of_turn>", "<end_of_turn>"] and {types[i] for i in user} == {4}
        assert "tokenizer.ggml.add_space_prefix" not in theirs
        # If this fails, llama.cpp's own file tokenizes as SentencePiece now: drop the two differences.
        assert _llama_ids(ref, special=True) != expected
    else:
        assert ours["tokenizer.ggml.token_type"][ours["tokenizer.ggml.tokens"].index("[INST]")] == 3
        assert ours["tokenizer.ggml.tokens"][-1] == "<extra_id_0>" and ours["tokenizer.ggml.token_type"][-1] == 4


def _llama_ids(path: Path, special: bool) -> dict[str, list[int]]:
    """llama.cpp's ids for the corpus; `special` lets it match user-defined pieces in text (SentencePiece always
    does; llama.cpp only when asked, as `mreg check` and servers do for chat prompts)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return {text: llm.tokenize(text.encode(), add_bos=False, special=special) for text in CORPUS}
    finally:
        llm.close()
