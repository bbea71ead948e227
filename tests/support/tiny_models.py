"""Deterministic builders of tiny, loadable Hugging Face model directories for tests."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "TRANSFORMERS_VERSION",
    "TensorData",
    "TensorEntry",
    "build_padded_model",
    "build_tiny_bert",
    "build_tiny_llama",
    "random_safetensors",
    "write_random_safetensors",
    "write_safetensors",
]

TRANSFORMERS_VERSION = "4.51.3"
"""The transformers release whose save_pretrained output the JSON files imitate."""

TensorData: TypeAlias = bytes | Callable[[BinaryIO], None]
"""A tensor's raw little-endian bytes, or a callback that writes exactly that many bytes."""

TensorEntry: TypeAlias = tuple[str, str, tuple[int, ...], TensorData]
"""One tensor for write_safetensors: name, dtype, shape and data."""

FloatArray: TypeAlias = npt.NDArray[np.float64]

# Safetensors dtypes in the order of the crate's Dtype enum (it lays data out by descending
# rank, then by name), with their item sizes.  Sub-byte dtypes (F4, F6_*) are left out.
_DTYPE_ORDER: tuple[tuple[str, int], ...] = (
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("F8_E5M2", 1),
    ("F8_E4M3", 1),
    ("F8_E8M0", 1),
    ("I16", 2),
    ("U16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("I32", 4),
    ("U32", 4),
    ("F32", 4),
    ("C64", 8),
    ("F64", 8),
    ("I64", 8),
    ("U64", 8),
)
_DTYPE_RANK = {code: rank for rank, (code, _) in enumerate(_DTYPE_ORDER)}
_DTYPE_SIZE = dict(_DTYPE_ORDER)
_DTYPE_ALIASES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}
_FLOAT_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ST_METADATA = {"format": "pt"}
_REPEAT_BLOCK_BYTES = 1 << 20
_HEADER_BYTES_PER_TENSOR = 112

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
_CAUSAL_SPECIAL_COUNT = 3

_LLAMA_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message %}"
    "{{- '[INST] <<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] + ' [/INST]' }}"
    "{%- else %}"
    "{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)

_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_BERT_WORDS = (
    "the of and to in is it that for on with as was this be by are at or from model file test hello world"
    " ##s ##ing ##ed ##er ##ly ##es ##tion ##al ##en ##re ##th ##in"
)


@dataclass(frozen=True)
class _Tensor:
    """A tensor to write: name, safetensors dtype code, shape, byte size and data."""

    name: str
    code: str
    shape: tuple[int, ...]
    nbytes: int
    data: TensorData


@dataclass(frozen=True)
class _CausalSpec:
    """The architecture of a llama-shaped causal language model."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    max_position_embeddings: int = 256

    @property
    def head_dim(self) -> int:
        """Return the width of one attention head."""
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class _ByteBpe:
    """A byte-level BPE vocabulary with its merges and special tokens."""

    vocab: dict[str, int]
    merges: tuple[tuple[str, str], ...]
    specials: dict[str, int]


# --------------------------------------------------------------------------- safetensors


def _dtype_code(dtype: str) -> str:
    """Return the safetensors code ("F32") for a code or a numpy-style name ("float32")."""
    if dtype in _DTYPE_RANK:
        return dtype
    code = _DTYPE_ALIASES.get(dtype)
    if code is None:
        raise ValueError(f"unsupported safetensors dtype {dtype!r}")
    return code


def _safetensors_header(tensors: Sequence[_Tensor], metadata: dict[str, str] | None) -> bytes:
    """Return the length-prefixed, space-padded JSON header for tensors already in file order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("safetensors metadata keys and values must be str")
        header["__metadata__"] = {key: metadata[key] for key in sorted(metadata)}
    offset = 0
    for tensor in tensors:
        end = offset + tensor.nbytes
        header[tensor.name] = {
            "dtype": tensor.code,
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _prepare_tensors(tensors: Iterable[TensorEntry]) -> list[_Tensor]:
    """Validate tensor entries and sort them into safetensors' data order."""
    prepared: list[_Tensor] = []
    seen: set[str] = set()
    for name, dtype, shape, data in tensors:
        if name == "__metadata__" or name in seen:
            raise ValueError(f"invalid or duplicate tensor name {name!r}")
        seen.add(name)
        code = _dtype_code(dtype)
        dims = tuple(int(dim) for dim in shape)
        if any(dim < 0 for dim in dims):
            raise ValueError(f"negative dimension in shape {dims} of {name!r}")
        nbytes = math.prod(dims) * _DTYPE_SIZE[code]
        if isinstance(data, (bytes, bytearray, memoryview)):
            if len(data) != nbytes:
                raise ValueError(f"{name!r}: {len(data)} bytes given, {nbytes} expected")
        elif not callable(data):
            raise TypeError(f"{name!r}: data must be bytes or a callable")
        prepared.append(_Tensor(name, code, dims, nbytes, data))
    prepared.sort(key=lambda tensor: (-_DTYPE_RANK[tensor.code], tensor.name))
    return prepared


def write_safetensors(
    path: Path,
    tensors: Iterable[tuple[str, str, tuple[int, ...], bytes | Callable[[BinaryIO], None]]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Stream tensors into a safetensors file laid out byte for byte as safetensors.save_file does."""
    prepared = _prepare_tensors(tensors)
    header = _safetensors_header(prepared, metadata)
    try:
        with open(path, "wb") as handle:
            handle.write(header)
            for tensor in prepared:
                start = handle.tell()
                if isinstance(tensor.data, (bytes, bytearray, memoryview)):
                    handle.write(tensor.data)
                else:
                    tensor.data(handle)
                written = handle.tell() - start
                if written != tensor.nbytes:
                    raise ValueError(f"{tensor.name!r}: callback wrote {written} bytes, {tensor.nbytes} expected")
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


def random_safetensors(size: int, seed: int = 0) -> bytes:
    """A valid safetensors file holding `size` random bytes as one U8 tensor (no float for a NaN scan to read)."""
    import random

    header = _safetensors_header(_prepare_tensors([("weight", "U8", (size,), lambda _: None)]), None)
    return header + random.Random(seed).randbytes(size)


def write_random_safetensors(path: Path, size: int, seed: int = 0) -> Path:
    """random_safetensors(size, seed) written to `path`."""
    path.write_bytes(random_safetensors(size, seed))
    return path


# --------------------------------------------------------------------------- random data


def _normal(seed: int, name: str, count: int) -> FloatArray:
    """Return count approximately standard-normal values, reproducible on any numpy/platform."""
    digest = hashlib.sha256(f"{seed}\x00{name}".encode()).digest()
    bitgen = np.random.PCG64(int.from_bytes(digest[:16], "little"))
    out = np.empty(count, dtype=np.float64)
    chunk = 1 << 15
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        raw = np.asarray(bitgen.random_raw(size * 12), dtype=np.uint64).reshape(12, size)
        # Irwin-Hall: the sum of 12 uniforms minus 6 has mean 0 and variance 1.  Summing the
        # 53-bit integers is exact, so the result does not depend on float summation order.
        total = (raw >> np.uint64(11)).sum(axis=0, dtype=np.uint64)
        out[start : start + size] = total.astype(np.float64) * 2.0**-53 - 6.0
    return out


def _encode(values: FloatArray, dtype: str) -> bytes:
    """Return float values as little-endian float32, float16 or bfloat16 bytes."""
    f32 = values.astype("<f4")
    if dtype == "float32":
        return f32.tobytes()
    if dtype == "float16":
        return f32.astype("<f2").tobytes()
    if dtype == "bfloat16":
        bits = f32.view("<u4").astype(np.uint32)
        rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        return ((bits + rounding) >> np.uint32(16)).astype("<u2").tobytes()
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_FLOAT_DTYPES)}")


def _init_values(seed: int, name: str, shape: tuple[int, ...]) -> FloatArray:
    """Return HF-like initial values: ones-ish for norm weights, small normal noise otherwise."""
    count = math.prod(shape)
    noise = _normal(seed, name, count)
    is_norm = "norm" in name.lower()
    if is_norm and name.endswith(".weight"):
        return 1.0 + 0.01 * noise
    if is_norm:
        return 0.01 * noise
    return 0.02 * noise


def _repeat_writer(block: bytes, nbytes: int, start: int) -> Callable[[BinaryIO], None]:
    """Return a callback writing nbytes by cycling through block from offset start."""

    def write(handle: BinaryIO) -> None:
        """Write the repeated block."""
        view = memoryview(block)
        position = start % len(block)
        remaining = nbytes
        while remaining:
            take = min(remaining, len(block) - position)
            handle.write(view[position : position + take])
            remaining -= take
            position = 0

    return write


# --------------------------------------------------------------------------- files


def _prepare_dest(dest: Path) -> Path:
    """Create dest, which must be absent or empty, and return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    return dest


def _write_json(path: Path, obj: Any, *, sort_keys: bool = True, newline: bool = True) -> None:
    """Write obj as two-space-indented UTF-8 JSON, as transformers' save_pretrained does."""
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False)
    path.write_bytes((text + ("\n" if newline else "")).encode("utf-8"))


def _split_even(tensors: Sequence[_Tensor], shards: int) -> list[list[_Tensor]]:
    """Split tensors, in order, into exactly shards non-empty groups of similar byte size."""
    if not 1 <= shards <= len(tensors):
        raise ValueError(f"shards must be between 1 and {len(tensors)}, got {shards}")
    total = sum(tensor.nbytes for tensor in tensors)
    groups: list[list[_Tensor]] = []
    index = 0
    done = 0
    for shard in range(shards):
        group = [tensors[index]]
        done += tensors[index].nbytes
        index += 1
        if shard == shards - 1:
            group.extend(tensors[index:])
            index = len(tensors)
        else:
            boundary = total * (shard + 1) / shards
            while len(tensors) - index > shards - 1 - shard and done + tensors[index].nbytes <= boundary:
                group.append(tensors[index])
                done += tensors[index].nbytes
                index += 1
        groups.append(group)
    return groups


def _split_max_bytes(tensors: Sequence[_Tensor], max_bytes: int) -> list[list[_Tensor]]:
    """Split tensors, in order, into groups of at most max_bytes, as save_pretrained does."""
    if max_bytes <= 0:
        raise ValueError("shard_bytes must be positive")
    groups: list[list[_Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if groups[-1] and size + tensor.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.nbytes
    return groups


def _write_weights(dest: Path, groups: Sequence[Sequence[_Tensor]]) -> list[str]:
    """Write model.safetensors, or numbered shards plus their index, and return the file names."""
    if len(groups) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, group in zip(names, groups, strict=True):
        entries = [(t.name, t.code, t.shape, t.data) for t in group]
        write_safetensors(dest / name, entries, metadata=_ST_METADATA)
    if len(groups) > 1:
        weight_map = {t.name: name for name, group in zip(names, groups, strict=True) for t in group}
        total_size = sum(t.nbytes for group in groups for t in group)
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        _write_json(dest / "model.safetensors.index.json", index)
    return names


# --------------------------------------------------------------------------- tokenizers


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


def _write_causal_tokenizer(dest: Path, spec: _CausalSpec) -> dict[str, int]:
    """Write the tokenizer files of a llama or qwen2 model and return the special token ids."""
    if spec.model_type == "qwen2":
        bpe = _byte_bpe(spec.vocab_size, (), ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
        post: dict[str, Any] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        }
        config: dict[str, Any] = {
            "add_bos_token": False,
            "add_prefix_space": False,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "chat_template": _CHATML_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": spec.max_position_embeddings,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
        special_map: dict[str, Any] = {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": _special_entry("<|im_end|>"),
            "pad_token": _special_entry("<|endoftext|>"),
        }
    else:
        bpe = _byte_bpe(spec.vocab_size, ("<unk>", "<s>", "</s>"), ())
        bos_id = bpe.specials["<s>"]
        template = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<s>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": _template_special("<s>", bos_id)},
        }
        post = {
            "type": "Sequence",
            "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                template,
            ],
        }
        config = {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "chat_template": _LLAMA_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "</s>",
            "legacy": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": spec.max_position_embeddings,
            "pad_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": "<unk>",
        }
        special_map = {
            "bos_token": _special_entry("<s>"),
            "eos_token": _special_entry("</s>"),
            "unk_token": _special_entry("<unk>"),
        }
    config["added_tokens_decoder"] = _added_tokens_decoder(bpe.specials)
    _write_json(dest / "tokenizer.json", _byte_level_tokenizer_json(bpe, post), sort_keys=False, newline=False)
    _write_json(dest / "tokenizer_config.json", config)
    _write_json(dest / "special_tokens_map.json", special_map)
    return bpe.specials


# --------------------------------------------------------------------------- causal LMs


def _causal_shapes(spec: _CausalSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Return the (name, shape) of every weight in state-dict order."""
    hidden = spec.hidden_size
    q_out = spec.num_heads * spec.head_dim
    kv_out = spec.num_kv_heads * spec.head_dim
    with_bias = spec.model_type == "qwen2"
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (spec.vocab_size, hidden))]
    for layer in range(spec.num_layers):
        prefix = f"model.layers.{layer}."
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            shapes.append((f"{prefix}self_attn.{proj}.weight", (out, hidden)))
            if with_bias:
                shapes.append((f"{prefix}self_attn.{proj}.bias", (out,)))
        shapes.append((f"{prefix}self_attn.o_proj.weight", (hidden, q_out)))
        shapes.append((f"{prefix}mlp.gate_proj.weight", (spec.intermediate_size, hidden)))
        shapes.append((f"{prefix}mlp.up_proj.weight", (spec.intermediate_size, hidden)))
        shapes.append((f"{prefix}mlp.down_proj.weight", (hidden, spec.intermediate_size)))
        shapes.append((f"{prefix}input_layernorm.weight", (hidden,)))
        shapes.append((f"{prefix}post_attention_layernorm.weight", (hidden,)))
    shapes.append(("model.norm.weight", (hidden,)))
    if not spec.tie_word_embeddings:
        shapes.append(("lm_head.weight", (spec.vocab_size, hidden)))
    return shapes


def _causal_config(spec: _CausalSpec, specials: dict[str, int]) -> dict[str, Any]:
    """Return config.json as LlamaConfig or Qwen2Config (transformers 4.51) saves it."""
    common: dict[str, Any] = {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "model_type": spec.model_type,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": spec.dtype,
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "vocab_size": spec.vocab_size,
    }
    if spec.model_type == "qwen2":
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "bos_token_id": specials["<|endoftext|>"],
            "eos_token_id": specials["<|im_end|>"],
            "max_window_layers": spec.num_layers,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "use_sliding_window": False,
            **common,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": specials["<s>"],
        "eos_token_id": specials["</s>"],
        "head_dim": spec.head_dim,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_theta": 10000.0,
        **common,
    }


def _generation_config(spec: _CausalSpec, specials: dict[str, int]) -> dict[str, Any]:
    """Return generation_config.json as the real llama / Qwen2 instruct models ship it."""
    if spec.model_type == "qwen2":
        return {
            "bos_token_id": specials["<|endoftext|>"],
            "do_sample": True,
            "eos_token_id": [specials["<|im_end|>"], specials["<|endoftext|>"]],
            "pad_token_id": specials["<|endoftext|>"],
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
            "transformers_version": TRANSFORMERS_VERSION,
        }
    return {
        "_from_model_config": True,
        "bos_token_id": specials["<s>"],
        "eos_token_id": specials["</s>"],
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _write_readme(dest: Path, title: str, front_matter: dict[str, str], lines: Sequence[str]) -> None:
    """Write a short model card with YAML front matter."""
    header = ["---", *(f"{key}: {value}" for key, value in front_matter.items()), "tags:", "- test-fixture", "---"]
    body = [
        f"# {title}",
        "",
        "Randomly initialised test fixture written by `tests/tiny_models.py` for the mreg test suite.",
        "It is not trained: it loads and runs, but its outputs are noise.",
        "",
        *(f"- {line}" for line in lines),
    ]
    dest.joinpath("README.md").write_bytes(("\n".join([*header, "", *body]) + "\n").encode("utf-8"))


def _write_causal_model(dest: Path, spec: _CausalSpec, groups: list[list[_Tensor]], title: str, seed: int) -> None:
    """Write the config, tokenizer, weights and README of a causal LM directory."""
    specials = _write_causal_tokenizer(dest, spec)
    _write_json(dest / "config.json", _causal_config(spec, specials))
    _write_json(dest / "generation_config.json", _generation_config(spec, specials))
    files = _write_weights(dest, groups)
    data_bytes = sum(t.nbytes for group in groups for t in group)
    architecture = "Qwen2ForCausalLM" if spec.model_type == "qwen2" else "LlamaForCausalLM"
    _write_readme(
        dest,
        title,
        {"library_name": "transformers", "pipeline_tag": "text-generation"},
        [
            f"architecture: `{architecture}` (model_type `{spec.model_type}`), seed {seed}",
            f"hidden_size {spec.hidden_size}, {spec.num_layers} layers, {spec.num_heads} heads "
            f"({spec.num_kv_heads} key/value), intermediate_size {spec.intermediate_size}",
            f"vocab_size {spec.vocab_size}, dtype {spec.dtype}, "
            f"tied embeddings: {'yes' if spec.tie_word_embeddings else 'no'}",
            f"{len(files)} safetensors file(s), {data_bytes} bytes of tensor data",
        ],
    )


def build_tiny_llama(
    dest: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 320,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    shards: int = 1,
    model_type: str = "llama",
) -> Path:
    """Write a tiny random LlamaForCausalLM (or Qwen2ForCausalLM) directory into dest and return it."""
    if model_type not in ("llama", "qwen2"):
        raise ValueError(f"model_type must be 'llama' or 'qwen2', got {model_type!r}")
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_FLOAT_DTYPES)}, got {dtype!r}")
    if min(hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size) <= 0:
        raise ValueError("sizes must be positive")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    spec = _CausalSpec(
        model_type=model_type,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings,
        dtype=dtype,
    )
    if vocab_size < 256 + _CAUSAL_SPECIAL_COUNT:
        raise ValueError(f"vocab_size must be at least {256 + _CAUSAL_SPECIAL_COUNT} (256 bytes + 3 specials)")
    code = _FLOAT_DTYPES[dtype]
    size = _DTYPE_SIZE[code]
    tensors = [
        _Tensor(name, code, shape, math.prod(shape) * size, _encode(_init_values(seed, name, shape), dtype))
        for name, shape in _causal_shapes(spec)
    ]
    groups = _split_even(tensors, shards)
    dest = _prepare_dest(dest)
    _write_causal_model(dest, spec, groups, f"tiny-{model_type}", seed)
    return dest


def _padded_spec(total_bytes: int) -> _CausalSpec:
    """Choose a bfloat16 llama architecture whose safetensors files total about total_bytes."""

    def layout(hidden: int) -> tuple[int, int, int, int]:
        """Return heads, kv heads, intermediate size and per-layer bytes for hidden."""
        heads = max(1, hidden // 64)
        kv_heads = heads // 4 if heads >= 4 else heads
        multiple = 256 if hidden >= 1024 else 64
        intermediate = -(-8 * hidden // (3 * multiple)) * multiple
        params = 2 * hidden * hidden + 2 * hidden * kv_heads * (hidden // heads)
        params += 3 * hidden * intermediate + 2 * hidden
        return heads, kv_heads, intermediate, 2 * params + _HEADER_BYTES_PER_TENSOR * 9

    min_vocab = 320
    candidates = [64 << shift for shift in range(8)]
    hidden = candidates[0]
    for option in candidates:
        embed = 2 * (2 * min_vocab * option) + 2 * option
        if embed + 8 * layout(option)[3] <= total_bytes:
            hidden = option
    heads, kv_heads, intermediate, layer_bytes = layout(hidden)
    fixed = 2 * (2 * min_vocab * hidden) + 2 * hidden + 3 * _HEADER_BYTES_PER_TENSOR
    layers = (total_bytes - fixed) // layer_bytes
    if layers < 1:
        raise ValueError(f"total_bytes must be at least {fixed + layer_bytes}")
    spare = total_bytes - layers * layer_bytes - 2 * hidden - 3 * _HEADER_BYTES_PER_TENSOR
    vocab = spare // (2 * 2 * hidden)
    return _CausalSpec(
        model_type="llama",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def build_padded_model(dest: Path, total_bytes: int, *, seed: int = 0, shard_bytes: int = 1 << 30) -> Path:
    """Write a bfloat16 llama directory whose safetensors shards add up to about total_bytes."""
    spec = _padded_spec(total_bytes)
    block = _encode(0.02 * _normal(seed, "padding-block", _REPEAT_BLOCK_BYTES // 2), "bfloat16")
    tensors: list[_Tensor] = []
    for index, (name, shape) in enumerate(_causal_shapes(spec)):
        nbytes = math.prod(shape) * 2
        data: TensorData
        if len(shape) == 1:
            data = _encode(_init_values(seed, name, shape), "bfloat16")
        else:
            data = _repeat_writer(block, nbytes, 2 * index * 7919)
        tensors.append(_Tensor(name, "BF16", shape, nbytes, data))
    groups = _split_max_bytes(tensors, shard_bytes)
    dest = _prepare_dest(dest)
    _write_causal_model(dest, spec, groups, "padded-llama", seed)
    return dest


# --------------------------------------------------------------------------- bert


def _bert_vocab(vocab_size: int) -> list[str]:
    """Return a WordPiece vocabulary of exactly vocab_size tokens."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    required = [*_BERT_SPECIALS, *letters, *(f"##{letter}" for letter in letters)]
    if vocab_size < len(required):
        raise ValueError(f"vocab_size must be at least {len(required)}")
    punctuation = [chr(code) for code in range(0x21, 0x7F) if not chr(code).isalnum()]
    digits = [str(digit) for digit in range(10)]
    optional = [*punctuation, *digits, *(f"##{digit}" for digit in digits), *_BERT_WORDS.split()]
    tokens = list(dict.fromkeys([*required, *optional]))[:vocab_size]
    tokens.extend(f"[unused{i}]" for i in range(vocab_size - len(tokens)))
    return tokens


def _bert_shapes(
    hidden: int, layers: int, intermediate: int, vocab: int, positions: int
) -> list[tuple[str, tuple[int, ...]]]:
    """Return the (name, shape) of every BertModel weight in state-dict order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("embeddings.word_embeddings.weight", (vocab, hidden)),
        ("embeddings.position_embeddings.weight", (positions, hidden)),
        ("embeddings.token_type_embeddings.weight", (2, hidden)),
        ("embeddings.LayerNorm.weight", (hidden,)),
        ("embeddings.LayerNorm.bias", (hidden,)),
    ]
    for layer in range(layers):
        prefix = f"encoder.layer.{layer}."
        for part in ("query", "key", "value"):
            shapes.append((f"{prefix}attention.self.{part}.weight", (hidden, hidden)))
            shapes.append((f"{prefix}attention.self.{part}.bias", (hidden,)))
        shapes.extend(
            [
                (f"{prefix}attention.output.dense.weight", (hidden, hidden)),
                (f"{prefix}attention.output.dense.bias", (hidden,)),
                (f"{prefix}attention.output.LayerNorm.weight", (hidden,)),
                (f"{prefix}attention.output.LayerNorm.bias", (hidden,)),
                (f"{prefix}intermediate.dense.weight", (intermediate, hidden)),
                (f"{prefix}intermediate.dense.bias", (intermediate,)),
                (f"{prefix}output.dense.weight", (hidden, intermediate)),
                (f"{prefix}output.dense.bias", (hidden,)),
                (f"{prefix}output.LayerNorm.weight", (hidden,)),
                (f"{prefix}output.LayerNorm.bias", (hidden,)),
            ]
        )
    shapes.extend([("pooler.dense.weight", (hidden, hidden)), ("pooler.dense.bias", (hidden,))])
    return shapes


def _bert_tokenizer_json(vocab: list[str]) -> dict[str, Any]:
    """Return a tokenizers-loadable WordPiece tokenizer.json document for vocab."""
    ids = {token: index for index, token in enumerate(vocab)}

    def seq(special: str, type_id: int) -> dict[str, Any]:
        """Return a TemplateProcessing special-token piece."""
        return {"SpecialToken": {"id": special, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(token, ids[token]) for token in _BERT_SPECIALS],
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None,
            "lowercase": True,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [seq("[CLS]", 0), {"Sequence": {"id": "A", "type_id": 0}}, seq("[SEP]", 0)],
            "pair": [
                seq("[CLS]", 0),
                {"Sequence": {"id": "A", "type_id": 0}},
                seq("[SEP]", 0),
                {"Sequence": {"id": "B", "type_id": 1}},
                seq("[SEP]", 1),
            ],
            "special_tokens": {
                "[CLS]": _template_special("[CLS]", ids["[CLS]"]),
                "[SEP]": _template_special("[SEP]", ids["[SEP]"]),
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": ids,
        },
    }


def build_tiny_bert(
    dest: Path,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 64,
    vocab_size: int = 128,
) -> Path:
    """Write a tiny random BertModel directory with a WordPiece tokenizer into dest and return it."""
    if min(hidden_size, num_layers, num_heads, intermediate_size) <= 0:
        raise ValueError("sizes must be positive")
    if hidden_size % num_heads:
        raise ValueError("hidden_size must divide by num_heads")
    positions = 64
    vocab = _bert_vocab(vocab_size)
    tensors = [
        _Tensor(name, "F32", shape, math.prod(shape) * 4, _encode(_init_values(seed, name, shape), "float32"))
        for name, shape in _bert_shapes(hidden_size, num_layers, intermediate_size, vocab_size, positions)
    ]
    dest = _prepare_dest(dest)
    config = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": positions,
        "model_type": "bert",
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "transformers_version": TRANSFORMERS_VERSION,
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    _write_json(dest / "config.json", config)
    _write_weights(dest, [tensors])
    dest.joinpath("vocab.txt").write_bytes("".join(f"{token}\n" for token in vocab).encode("utf-8"))
    _write_json(dest / "tokenizer.json", _bert_tokenizer_json(vocab), sort_keys=False, newline=False)
    specials = {token: vocab.index(token) for token in _BERT_SPECIALS}
    _write_json(
        dest / "tokenizer_config.json",
        {
            "added_tokens_decoder": _added_tokens_decoder(specials),
            "clean_up_tokenization_spaces": True,
            "cls_token": "[CLS]",
            "do_basic_tokenize": True,
            "do_lower_case": True,
            "mask_token": "[MASK]",
            "model_max_length": positions,
            "never_split": None,
            "pad_token": "[PAD]",
            "sep_token": "[SEP]",
            "strip_accents": None,
            "tokenize_chinese_chars": True,
            "tokenizer_class": "BertTokenizer",
            "unk_token": "[UNK]",
        },
    )
    _write_json(
        dest / "special_tokens_map.json",
        {
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
            "pad_token": "[PAD]",
            "sep_token": "[SEP]",
            "unk_token": "[UNK]",
        },
    )
    _write_readme(
        dest,
        "tiny-bert",
        {"library_name": "transformers", "pipeline_tag": "feature-extraction"},
        [
            f"architecture: `BertModel` (model_type `bert`), seed {seed}",
            f"hidden_size {hidden_size}, {num_layers} layers, {num_heads} heads, intermediate_size {intermediate_size}",
            f"vocab_size {vocab_size} (WordPiece, lower-cased), dtype float32",
            f"1 safetensors file, {sum(t.nbytes for t in tensors)} bytes of tensor data",
        ],
    )
    return dest


def rewrite_config(dest: Path, **changes: Any) -> Path:
    """config.json of a model directory with some keys changed; the directory."""
    path = dest / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dest


def set_value(dest: Path, tensor: str, index: int, value: float) -> Path:
    """Overwrite element `index` (row-major) of a float tensor in dest's safetensors files with `value`, in place."""
    names = {code: name for name, code in _FLOAT_DTYPES.items()}
    for path in sorted(Path(dest).glob("*.safetensors")):
        with open(path, "r+b") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            info = json.loads(handle.read(length)).get(tensor)
            if info is None:
                continue
            if not 0 <= index < math.prod(info["shape"]):
                raise IndexError(f"{tensor} has {math.prod(info['shape'])} elements, not {index + 1}")
            handle.seek(8 + length + info["data_offsets"][0] + index * _DTYPE_SIZE[info["dtype"]])
            handle.write(_encode(np.asarray([value], dtype=np.float64), names[info["dtype"]]))
        return dest
    raise KeyError(f"no safetensors file in {dest} holds {tensor}")
