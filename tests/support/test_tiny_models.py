"""Tests for the tiny model fixture builders in tests/support/tiny_models/."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import load_file, save_file

try:  # tests/ on sys.path (pytest's default "prepend" import mode, no tests/__init__.py)
    from support.tiny_models import build_padded_model, build_tiny_bert, build_tiny_llama, write_safetensors
except ModuleNotFoundError:  # tests/ imported as a package
    from tests.tiny_models import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        build_padded_model,
        build_tiny_bert,
        build_tiny_llama,
        write_safetensors,
    )


def _files(root: Path) -> dict[str, bytes]:
    """Return every file under root by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _header(path: Path) -> dict[str, Any]:
    """Return the parsed JSON header of a safetensors file."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    return header


def _read_json(path: Path) -> Any:
    """Return the parsed JSON document at path."""
    return json.loads(path.read_text(encoding="utf-8"))


def _llama_names(layers: int, *, bias: bool = False, tied: bool = False) -> set[str]:
    """Return the tensor names of a llama/qwen2 model."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not tied:
        names.add("lm_head.weight")
    for i in range(layers):
        p = f"model.layers.{i}."
        names |= {f"{p}self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
        names |= {f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"}
        if bias:
            names |= {f"{p}self_attn.{x}_proj.bias" for x in "qkv"}
    return names


def _bf16_to_f32(raw: bytes) -> npt.NDArray[np.float32]:
    """Decode little-endian bfloat16 bytes to float32."""
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


def test_llama_is_deterministic(tmp_path: Path) -> None:
    """Two builds with the same arguments are byte-identical; another seed changes the weights."""
    a = _files(build_tiny_llama(tmp_path / "a", seed=3, shards=2))
    b = _files(build_tiny_llama(tmp_path / "b", seed=3, shards=2))
    c = _files(build_tiny_llama(tmp_path / "c", seed=4, shards=2))
    assert a == b
    assert a.keys() == c.keys()
    assert a["model-00001-of-00002.safetensors"] != c["model-00001-of-00002.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]


def test_llama_weights_and_config(tmp_path: Path) -> None:
    """The llama directory has HF tensor names, shapes, float32 data and a LlamaConfig-like config."""
    d = build_tiny_llama(tmp_path / "m")
    assert sorted(p.name for p in d.iterdir()) == [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    weights = load_file(str(d / "model.safetensors"))
    assert set(weights) == _llama_names(2)
    assert all(w.dtype == np.float32 for w in weights.values())
    assert weights["model.embed_tokens.weight"].shape == (320, 64)
    assert weights["lm_head.weight"].shape == (320, 64)
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)
    assert weights["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert weights["model.layers.1.self_attn.o_proj.weight"].shape == (64, 64)
    assert weights["model.layers.0.mlp.gate_proj.weight"].shape == (128, 64)
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert weights["model.norm.weight"].shape == (64,)
    assert 0.015 < float(weights["model.embed_tokens.weight"].std()) < 0.025
    assert abs(float(weights["model.embed_tokens.weight"].mean())) < 0.002
    assert np.allclose(weights["model.norm.weight"], 1.0, atol=0.06)
    assert _header(d / "model.safetensors")["__metadata__"] == {"format": "pt"}

    config = _read_json(d / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 320,
        "head_dim": 16,
        "hidden_act": "silu",
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {k: config[k] for k in expected} == expected
    assert {"max_position_embeddings", "rms_norm_eps", "rope_theta", "transformers_version"} <= config.keys()
    assert list(config) == sorted(config)
    generation = _read_json(d / "generation_config.json")
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    assert (d / "README.md").read_text().startswith("---\n")


def test_llama_tied_half_precision(tmp_path: Path) -> None:
    """Tied embeddings drop lm_head; float16 weights load as float16."""
    d = build_tiny_llama(tmp_path / "m", tie_word_embeddings=True, dtype="float16", num_layers=1)
    weights = load_file(str(d / "model.safetensors"))
    assert set(weights) == _llama_names(1, tied=True)
    assert all(w.dtype == np.float16 for w in weights.values())
    assert _read_json(d / "config.json")["tie_word_embeddings"] is True
    assert _read_json(d / "config.json")["torch_dtype"] == "float16"


def test_llama_bfloat16(tmp_path: Path) -> None:
    """Bfloat16 weights are BF16 in the header and decode to sensible values."""
    d = build_tiny_llama(tmp_path / "bf", dtype="bfloat16", seed=1)
    f32 = load_file(str(build_tiny_llama(tmp_path / "f32", seed=1) / "model.safetensors"))
    path = d / "model.safetensors"
    header = _header(path)
    info = header["model.embed_tokens.weight"]
    assert info["dtype"] == "BF16" and info["shape"] == [320, 64]
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    raw = path.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    begin, end = info["data_offsets"]
    values = _bf16_to_f32(raw[start + begin : start + end]).reshape(320, 64)
    reference = f32["model.embed_tokens.weight"]
    assert np.allclose(values, reference, rtol=2**-8, atol=0)


def test_llama_shards_and_index(tmp_path: Path) -> None:
    """Sharded output has numbered files and an index that matches their contents."""
    d = build_tiny_llama(tmp_path / "m", shards=3)
    shard_names = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(p.name for p in d.glob("*.safetensors")) == shard_names
    index = _read_json(d / "model.safetensors.index.json")
    weight_map: dict[str, str] = index["weight_map"]
    assert set(weight_map) == _llama_names(2)
    assert set(weight_map.values()) == set(shard_names)
    total = 0
    for name in shard_names:
        weights = load_file(str(d / name))
        assert set(weights) == {k for k, v in weight_map.items() if v == name}
        total += sum(w.nbytes for w in weights.values())
    assert index["metadata"]["total_size"] == total


def test_qwen2(tmp_path: Path) -> None:
    """model_type qwen2 gives Qwen2 config, q/k/v biases and ChatML special tokens."""
    d = build_tiny_llama(tmp_path / "q", model_type="qwen2")
    weights = load_file(str(d / "model.safetensors"))
    assert set(weights) == _llama_names(2, bias=True)
    assert weights["model.layers.0.self_attn.q_proj.bias"].shape == (64,)
    assert weights["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    config = _read_json(d / "config.json")
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["model_type"] == "qwen2"
    assert "head_dim" not in config and "attention_bias" not in config
    tokenizer = _read_json(d / "tokenizer.json")
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert set(specials) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert max(specials.values()) < 320
    assert config["bos_token_id"] == specials["<|endoftext|>"]
    assert config["eos_token_id"] == specials["<|im_end|>"]
    tok_config = _read_json(d / "tokenizer_config.json")
    assert tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok_config["chat_template"]


def test_llama_tokenizer_files(tmp_path: Path) -> None:
    """The llama tokenizer files are byte-level BPE with <s>/</s> and a chat template."""
    d = build_tiny_llama(tmp_path / "m")
    tokenizer = _read_json(d / "tokenizer.json")
    assert tokenizer["model"]["type"] == "BPE"
    assert tokenizer["pre_tokenizer"]["type"] == "ByteLevel"
    assert tokenizer["decoder"]["type"] == "ByteLevel"
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert len(vocab) == 320
    assert len(tokenizer["model"]["merges"]) >= 30
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert specials == {"<unk>": 0, "<s>": 1, "</s>": 2}
    tok_config = _read_json(d / "tokenizer_config.json")
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["add_bos_token"]) == ("<s>", "</s>", True)
    assert "[INST]" in tok_config["chat_template"]
    special_map = _read_json(d / "special_tokens_map.json")
    assert special_map["bos_token"]["content"] == "<s>"
    assert special_map["eos_token"]["content"] == "</s>"


def test_bert(tmp_path: Path) -> None:
    """The bert directory has BertModel tensors, a full vocab.txt and WordPiece tokenizer files."""
    d = build_tiny_bert(tmp_path / "b")
    assert _files(d) == _files(build_tiny_bert(tmp_path / "b2"))
    weights = load_file(str(d / "model.safetensors"))
    assert len(weights) == 5 + 2 * 16 + 2
    assert weights["embeddings.word_embeddings.weight"].shape == (128, 32)
    assert weights["embeddings.position_embeddings.weight"].shape == (64, 32)
    assert weights["embeddings.token_type_embeddings.weight"].shape == (2, 32)
    assert weights["encoder.layer.1.attention.self.query.weight"].shape == (32, 32)
    assert weights["encoder.layer.1.attention.output.LayerNorm.bias"].shape == (32,)
    assert weights["encoder.layer.0.intermediate.dense.weight"].shape == (64, 32)
    assert weights["encoder.layer.0.output.dense.weight"].shape == (32, 64)
    assert weights["pooler.dense.bias"].shape == (32,)
    assert all(w.dtype == np.float32 for w in weights.values())
    config = _read_json(d / "config.json")
    assert config["architectures"] == ["BertModel"]
    assert (config["model_type"], config["type_vocab_size"], config["pad_token_id"]) == ("bert", 2, 0)
    assert config["max_position_embeddings"] == 64
    vocab = (d / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 128 == len(set(vocab))
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = _read_json(d / "tokenizer.json")
    assert tokenizer["model"]["type"] == "WordPiece"
    assert tokenizer["model"]["vocab"] == {token: i for i, token in enumerate(vocab)}
    assert tokenizer["normalizer"]["type"] == "BertNormalizer"
    assert tokenizer["pre_tokenizer"]["type"] == "BertPreTokenizer"
    assert tokenizer["post_processor"]["type"] == "TemplateProcessing"
    tok_config = _read_json(d / "tokenizer_config.json")
    assert (tok_config["tokenizer_class"], tok_config["do_lower_case"]) == ("BertTokenizer", True)


def test_tokenizers_load_and_round_trip(tmp_path: Path) -> None:
    """The tokenizers library loads every tokenizer.json, and encode/decode round-trips."""
    tokenizers = pytest.importorskip("tokenizers")
    texts = ["Hello world!", "The model registry keeps track of every model.", "tabs\tand\nnewlines, 123 café 😀"]
    for model_type in ("llama", "qwen2"):
        d = build_tiny_llama(tmp_path / model_type, model_type=model_type)
        tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        assert tok.get_vocab_size(with_added_tokens=True) <= 320
        for text in texts:
            encoding = tok.encode(text)
            assert max(encoding.ids) < 320
            assert tok.decode(encoding.ids, skip_special_tokens=True) == text
        assert len(tok.encode(" model").ids) <= 2  # learned merges are used
    llama = tokenizers.Tokenizer.from_file(str(tmp_path / "llama" / "tokenizer.json"))
    assert llama.encode("hi").tokens[0] == "<s>"
    qwen = tokenizers.Tokenizer.from_file(str(tmp_path / "qwen2" / "tokenizer.json"))
    chat = "<|im_start|>user\nhi<|im_end|>"
    assert qwen.encode(chat).tokens[0] == "<|im_start|>"
    assert qwen.decode(qwen.encode(chat).ids, skip_special_tokens=False) == chat

    bert = tokenizers.Tokenizer.from_file(str(build_tiny_bert(tmp_path / "bert") / "tokenizer.json"))
    encoding = bert.encode("Hello World, this is a test 42!")
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert "[UNK]" not in encoding.tokens
    assert bert.decode(encoding.ids) == "hello world, this is a test 42!"


def _sample_tensors() -> dict[str, npt.NDArray[Any]]:
    """Return tensors of several dtypes and shapes, including scalar and empty ones."""
    rng = np.random.default_rng(0)
    return {
        "zeta.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "alpha": rng.standard_normal((7,)).astype(np.float16),
        "beta.ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "gamma.mask": np.array([True, False, True]),
        "delta.bytes": np.arange(5, dtype=np.uint8),
        "epsilon.scalar": np.array(2.5, dtype=np.float64),
        "eta.empty": np.zeros((0, 4), dtype=np.float32),
        "theta.i32": np.arange(4, dtype=np.int32),
        "Upper": np.ones((2, 2), dtype=np.float32),
    }


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_streaming_writer_matches_save_file(tmp_path: Path, metadata: dict[str, str] | None) -> None:
    """write_safetensors output is byte-identical to safetensors.numpy.save_file, whatever the input order."""
    tensors = _sample_tensors()
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata=metadata)

    def callback(array: npt.NDArray[Any]) -> Any:
        """Return a callback writing array's bytes in two pieces."""

        def write(handle: BinaryIO) -> None:
            """Write the array."""
            raw = array.tobytes()
            handle.write(raw[: len(raw) // 2])
            handle.write(raw[len(raw) // 2 :])

        return write

    entries = [
        (name, str(array.dtype), tuple(array.shape), callback(array) if i % 2 else array.tobytes())
        for i, (name, array) in enumerate(reversed(tensors.items()))
    ]
    write_safetensors(tmp_path / "ours.safetensors", entries, metadata=metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    loaded = load_file(str(tmp_path / "ours.safetensors"))
    for name, array in tensors.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)


def test_streaming_writer_checks_sizes(tmp_path: Path) -> None:
    """Wrong data lengths and bad dtypes are rejected, and no partial file is left behind."""
    path = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="expected"):
        write_safetensors(path, [("a", "F32", (2,), b"\0" * 4)])

    def short(handle: BinaryIO) -> None:
        """Write one float32 where two are due."""
        handle.write(b"\0" * 4)

    with pytest.raises(ValueError, match="callback wrote"):
        write_safetensors(path, [("a", "F32", (2,), short)])
    assert not path.exists()
    with pytest.raises(ValueError, match="dtype"):
        write_safetensors(path, [("a", "complex128", (1,), b"\0" * 16)])
    with pytest.raises(ValueError, match="duplicate"):
        write_safetensors(path, [("a", "U8", (1,), b"\0"), ("a", "U8", (1,), b"\0")])


def test_builders_reject_bad_arguments(tmp_path: Path) -> None:
    """Invalid shapes, dtypes, model types and non-empty destinations raise errors."""
    with pytest.raises(ValueError):
        build_tiny_llama(tmp_path / "a", model_type="gpt2")
    with pytest.raises(ValueError):
        build_tiny_llama(tmp_path / "b", dtype="int8")
    with pytest.raises(ValueError):
        build_tiny_llama(tmp_path / "c", num_heads=3)
    with pytest.raises(ValueError):
        build_tiny_llama(tmp_path / "d", vocab_size=200)
    build_tiny_bert(tmp_path / "e")
    with pytest.raises(FileExistsError):
        build_tiny_bert(tmp_path / "e")


def test_padded_model(tmp_path: Path) -> None:
    """A padded model hits its byte target across several shards, consistently indexed and reproducible."""
    target = 3_000_000
    d = build_padded_model(tmp_path / "p", target, shard_bytes=1_000_000)
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) >= 3
    total = sum(p.stat().st_size for p in shards)
    assert abs(total - target) / target < 0.02
    index = _read_json(d / "model.safetensors.index.json")
    data_bytes = 0
    for shard in shards:
        header = _header(shard)
        names = {k for k in header if k != "__metadata__"}
        assert names == {k for k, v in index["weight_map"].items() if v == shard.name}
        assert {header[k]["dtype"] for k in names} == {"BF16"}
        ends = sorted(header[k]["data_offsets"][1] for k in names)
        shard_data = shard.stat().st_size - 8 - struct.unpack("<Q", shard.read_bytes()[:8])[0]
        assert ends[-1] == shard_data <= 1_000_000
        data_bytes += shard_data
    assert index["metadata"]["total_size"] == data_bytes
    config = _read_json(d / "config.json")
    assert config["torch_dtype"] == "bfloat16"
    assert set(index["weight_map"]) == _llama_names(config["num_hidden_layers"])
    first = _header(shards[0])
    embed_shard = d / index["weight_map"]["model.embed_tokens.weight"]
    embed = _header(embed_shard)["model.embed_tokens.weight"]
    assert embed["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert first["__metadata__"] == {"format": "pt"}
    raw = embed_shard.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0] + embed["data_offsets"][0]
    values = _bf16_to_f32(raw[start : start + 4096])
    assert np.isfinite(values).all() and 0.01 < float(values.std()) < 0.03
    assert _files(d) == _files(build_padded_model(tmp_path / "q", target, shard_bytes=1_000_000))
