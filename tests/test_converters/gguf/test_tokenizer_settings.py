"""Tokenizer settings transformers honours (tokenizer_config.json's add_prefix_space, add_bos_token, add_eos_token)
and the model's name, written as llama.cpp's own converter writes them, and a verification that tokenizes as the
checkpoint configures it: a setting mreg would miss makes the conversion fail instead of publishing.

Each source is a tiny Llama (SentencePiece or byte-level BPE); llama.cpp's converter (`--vocab-only`, from
llama-cpp-python's source package) converts the same directories once for the module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import field, reference_vocab_files

from converters.gguf.verify import gguf_reader

pytest.importorskip("llama_cpp")
pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

#: The keys the settings decide.
KEYS = ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
        "general.name")
#: source -> (builder, tokenizer_config.json entries, config.json entries, model card front matter).
SOURCES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "no-prefix": ("llama-spm", {"add_prefix_space": False, "legacy": False}, {}, ""),
    "no-bos": ("llama-spm", {"add_bos_token": False}, {}, ""),
    "with-eos": ("llama-spm", {"add_eos_token": True}, {}, ""),
    # llama.cpp's converter knows the tiny BPE tokenizer by none of its hashes: the names go on SentencePiece ones.
    "carded": ("llama-spm", {}, {}, "name: Tiny Card Llama\n"),
    "repo-id": ("llama-spm", {}, {"_name_or_path": "someorg/tiny-llama-v2-7b"}, ""),
    "Plain-Dir-v1": ("llama-spm", {}, {}, ""),
}


def _build(dest: Path, kind: str) -> Path:
    from test_converters.conftest import BUILDERS

    builder, tokenizer_config, config, card = SOURCES[kind]
    BUILDERS[builder](dest)
    for name, changes in (("tokenizer_config.json", tokenizer_config), ("config.json", config)):
        doc = json.loads((dest / name).read_text())
        (dest / name).write_text(json.dumps({**doc, **changes}, indent=2))
    if card:
        readme = (dest / "README.md").read_text()
        (dest / "README.md").write_text(readme.replace("---\n", "---\n" + card, 1))
    return dest


@pytest.fixture(scope="module")
def built(llama_cpp_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path | str]]:
    base = tmp_path_factory.mktemp("tokenizer-settings")
    sources = {kind: _build(base / kind, kind) for kind in SOURCES}
    refs = reference_vocab_files(llama_cpp_root, sources, base / "reference")
    return {kind: (sources[kind], refs[kind]) for kind in SOURCES}


def _keys(path: Path) -> dict[str, Any]:
    reader = gguf_reader(path)
    return {k: field(reader, k) for k in KEYS if k in reader.fields}


@pytest.mark.parametrize("kind", list(SOURCES))
@pytest.mark.slow
def test_settings_are_written_as_llama_cpp_writes_them_and_verified(
        kind: str, built: dict[str, tuple[Path, Path | str]], mreg: Any, store_root: Path) -> None:
    src, ref = built[kind]
    assert isinstance(ref, Path), f"llama.cpp's converter failed: {ref}"
    # A store name with "phi3" in it: llama.cpp applies its Phi-3 rules by general.name, so it must not be that.
    convert(mreg, src, "gguf:F16", name="phi3-test")
    art, out = artifact(store_root, "phi3-test", 1, "gguf")
    v = art["verification"]
    assert v["status"] == "passed", v["detail"]
    assert v["metrics"]["tokenization_mismatches"] == 0 and "sentencepiece" in v["method"]
    (path,) = out.glob("*.gguf")
    assert path.name == "phi3-test-F16.gguf", "the file keeps the store's name"
    assert _keys(path) == _keys(ref)


@pytest.mark.parametrize("kind", ["no-prefix", "no-bos", "with-eos"])
def test_the_reference_tokenizes_as_transformers_and_the_settings_matter(
        kind: str, built: dict[str, tuple[Path, Path | str]]) -> None:
    """The verification's reference gives transformers' ids, and these differ from SentencePiece's defaults."""
    import sentencepiece
    import transformers

    from converters.gguf.tokenization import reference

    src = built[kind][0]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    encode = reference(src).encode
    assert encode is not None
    for text in ("Hello world", "A model registry keeps track of every model."):
        assert encode(text) == tok(text)["input_ids"] != [sp.bos_id(), *sp.encode(text)], kind


def test_a_setting_mreg_missed_fails_the_conversion(built: dict[str, tuple[Path, Path | str]], mreg: Any,
                                                   store_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the add_space_prefix key llama.cpp adds the space transformers does not: the verification says so."""
    monkeypatch.setattr("converters.gguf.plan.LLAMA_PATH", ())
    r = mreg("convert", built["no-prefix"][0], "--to", "gguf:F16", "--name", "m")
    assert r.exit_code == 4, r.stderr
    assert "tokenizes" in r.stderr and "differently" in r.stderr
    assert not (store_root / "models" / "m" / "versions").exists()
