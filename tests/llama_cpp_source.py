"""llama.cpp's own files, from the llama-cpp-python source package on PyPI (the package registry).

Two uses:
- the GGUF bench runs llama.cpp's `convert_hf_to_gguf.py` on the same input as mreg;
- the tests and the bench take real tokenizers from llama.cpp's vocabulary files
  (`models/ggml-vocab-*.gguf`: Llama 2's SentencePiece, Llama 3's and Qwen2's byte-level BPE),
  written back as the Hugging Face files those models ship, and the token ids that the models' own
  Hugging Face tokenizers give for llama.cpp's tokenizer test strings (`.inp` / `.out`).

The package is the installed llama-cpp-python's version, downloaded with pip once per cache directory
(or taken from `MREG_LLAMA_CPP_SDIST`, a path to the .tar.gz).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SDIST_ENV = "MREG_LLAMA_CPP_SDIST"
#: The vocabularies the tests use, by llama.cpp's name, with the architecture they come from.
VOCABS = {"llama-spm": "llama", "llama-bpe": "llama", "qwen2": "qwen2"}
_SEPARATOR = "\n__ggml_vocab_test__\n"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class Unavailable(Exception):
    """The source package could not be had (no llama-cpp-python installed, or pip could not download it)."""


def _wanted(name: str) -> bool:
    return name.endswith(".py") or "/gguf-py/" in name or (
        "/models/ggml-vocab-" in name and name.rsplit("/", 1)[-1].split(".gguf")[0][len("ggml-vocab-"):] in VOCABS)


def source(cache: Path) -> Path:
    """`vendor/llama.cpp` of the installed llama-cpp-python's source package, extracted once under cache."""
    from importlib import metadata

    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError as e:
        raise Unavailable("llama-cpp-python is not installed") from e
    root = cache / f"llama.cpp-{version}"
    if (root / "convert_hf_to_gguf.py").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        archive = os.environ.get(SDIST_ENV)
        if not archive:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                   f"llama-cpp-python=={version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise Unavailable(f"pip could not download llama-cpp-python {version}'s source: "
                                  f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
            (found,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
            archive = str(found)
        with tarfile.open(archive) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix) and _wanted(m.name)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(Path(tmp) / "tree", members=members, filter="data")
        if not (Path(tmp) / "tree" / "convert_hf_to_gguf.py").is_file():
            raise Unavailable(f"{archive} has no vendor/llama.cpp/convert_hf_to_gguf.py")
        try:
            (Path(tmp) / "tree").rename(root)
        except OSError:  # another process extracted it first
            shutil.rmtree(Path(tmp) / "tree", ignore_errors=True)
    return root


@dataclass(frozen=True)
class RealVocab:
    """One of llama.cpp's vocabulary files, as read with gguf's reader."""

    name: str
    architecture: str
    model: str  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float]
    merges: list[str]
    bos: int | None
    eos: int | None
    chat_template: str | None

    @property
    def size(self) -> int:
        return len(self.tokens)


def read_vocab(root: Path, name: str) -> RealVocab:
    """The vocabulary file `models/ggml-vocab-NAME.gguf`."""
    from converters.gguf_verify import gguf_reader

    reader = gguf_reader(root / "models" / f"ggml-vocab-{name}.gguf")

    def get(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    return RealVocab(name, VOCABS[name], get("tokenizer.ggml.model"), get("tokenizer.ggml.pre"),
                     get("tokenizer.ggml.tokens"),
                     get("tokenizer.ggml.token_type"), get("tokenizer.ggml.scores", []),
                     get("tokenizer.ggml.merges", []), get("tokenizer.ggml.bos_token_id"),
                     get("tokenizer.ggml.eos_token_id"), get("tokenizer.chat_template"))


def cases(root: Path, name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test strings with the ids the model's Hugging Face tokenizer gives (no BOS)."""
    texts = (root / "models" / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(_SEPARATOR)
    ids = (root / "models" / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, ids, strict=False)]


#: The Split regexes of Qwen2's and Llama 3's tokenizer.json (Llama 3 groups digits in threes).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(**kw: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False, **kw}


def _tokenizer_json(v: RealVocab) -> dict[str, Any]:
    """tokenizer.json as Qwen2 and Llama 3 publish it (their layout; this vocabulary and these merges)."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True)) if ty == CONTROL]
    vocab = {t: i for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True)) if ty == NORMAL}
    qwen = v.name == "qwen2"
    split = {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT if qwen else _LLAMA3_SPLIT},
             "behavior": "Isolated", "invert": False}
    if qwen:
        post: dict[str, Any] = _byte_level()
        decoder = _byte_level()
    else:
        bos = v.tokens[v.bos or 0]
        post = {"type": "Sequence", "processors": [
            _byte_level(add_prefix_space=True, use_regex=True),
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [v.bos], "tokens": [bos]}}}]}
        decoder = _byte_level(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if qwen else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, _byte_level(trim_offsets=not qwen)]},
        "post_processor": post, "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": not qwen,
                  "vocab": vocab, "merges": v.merges},
    }


def _sentencepiece_model(v: RealVocab) -> bytes:
    """tokenizer.model as Llama 2 publishes it: BPE with byte fallback, identity normalization, a dummy prefix."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    proto = spm.ModelProto()
    for token, score, kind in zip(v.tokens, v.scores, v.types, strict=True):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = token, score, kind
    t = proto.trainer_spec
    t.model_type, t.vocab_size, t.byte_fallback = spm.TrainerSpec.BPE, v.size, True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = v.tokens.index("<unk>"), v.bos or 1, v.eos or 2, -1
    t.split_digits, t.allow_whitespace_only_pieces = True, True
    n = proto.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", True, False, True
    return bytes(proto.SerializeToString())


def write_tokenizer(v: RealVocab, dest: Path) -> None:
    """The tokenizer files of the model the vocabulary comes from, replacing any in dest."""
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        (dest / name).unlink(missing_ok=True)
    config: dict[str, Any] = {"model_max_length": 2048, "clean_up_tokenization_spaces": False}
    if v.model == "llama":
        (dest / "tokenizer.model").write_bytes(_sentencepiece_model(v))
        config.update(tokenizer_class="LlamaTokenizer", legacy=True, add_bos_token=True, add_eos_token=False,
                      bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token=None)
    else:
        (dest / "tokenizer.json").write_text(json.dumps(_tokenizer_json(v), ensure_ascii=False), encoding="utf-8")
        config.update(tokenizer_class="PreTrainedTokenizerFast", bos_token=v.tokens[v.bos] if v.bos is not None
                      else None, eos_token=v.tokens[v.eos] if v.eos is not None else None)
        if v.name == "qwen2":
            config.update(tokenizer_class="Qwen2Tokenizer", add_bos_token=False, bos_token=None,
                          eos_token="<|im_end|>", pad_token="<|endoftext|>", errors="replace",
                          split_special_tokens=False, add_prefix_space=False)
    if v.chat_template:
        config["chat_template"] = v.chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
