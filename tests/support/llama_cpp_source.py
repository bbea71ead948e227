"""llama.cpp's own files, from the llama-cpp-python source package on PyPI (the package registry).

Three uses:
- the GGUF bench runs llama.cpp's `convert_hf_to_gguf.py` on the same input as mreg;
- the chat-template tests take the real templates llama.cpp collects (`models/templates/*.jinja`);
- the tests and the bench take real tokenizers from llama.cpp's vocabulary files
  (`models/ggml-vocab-*.gguf`: Llama 2's SentencePiece, Llama 3's byte-level BPE, and Qwen's, which
  llama.cpp built from Qwen1.5-7B: the BPE and pre-tokenizer Qwen2 and Qwen2.5 use, without the
  special tokens Qwen2.5 adds), written back as the Hugging Face files those models ship, and the
  token ids that the models' own Hugging Face tokenizers give for llama.cpp's tokenizer test strings
  (`.inp` / `.out`).

The package is the installed llama-cpp-python's version. The tests never download: `nox -s tests`
fetches it from PyPI while it sets up the environment (`python tests/support/llama_cpp_source.py DIR`) and
passes its path in `MREG_LLAMA_CPP_SDIST`. The bench downloads it itself when that is not set.
"""

from __future__ import annotations

import contextlib
import functools
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

from converters.gguf.vocab import CONTROL, NORMAL

SDIST_ENV = "MREG_LLAMA_CPP_SDIST"
#: The vocabularies the tests use, by llama.cpp's name, with the architecture they come from.
VOCABS = {"llama-spm": "llama", "llama-bpe": "llama", "qwen2": "qwen2"}
_SEPARATOR = "\n__ggml_vocab_test__\n"


class Unavailable(Exception):
    """The source package could not be had (no llama-cpp-python installed, or pip could not download it)."""


#: One of the real chat templates (`models/templates/*.jinja`), to tell a tree extracted with them.
QWEN25_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


def _wanted(name: str) -> bool:
    return name.endswith(".py") or "/gguf-py/" in name or (
        "/models/ggml-vocab-" in name and name.rsplit("/", 1)[-1].split(".gguf")[0][len("ggml-vocab-"):] in VOCABS
    ) or ("/models/templates/" in name and name.endswith(".jinja"))


def _complete(root: Path) -> bool:
    """The converter, every vocabulary with its test files, and the chat templates are there."""
    vocab_files = [f"ggml-vocab-{name}.gguf{suffix}" for name in VOCABS for suffix in ("", ".inp", ".out")]
    return (root / "convert_hf_to_gguf.py").is_file() and all((root / "models" / f).is_file() for f in vocab_files) \
        and (root / "models" / "templates" / QWEN25_TEMPLATE).is_file()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError as e:
        raise Unavailable("llama-cpp-python is not installed") from e


def download(dest: Path) -> Path:
    """The installed llama-cpp-python's source package, downloaded from PyPI into dest (once)."""
    version = _version()
    found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
           f"llama-cpp-python=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        raise Unavailable(f"pip took over 10 minutes to download llama-cpp-python {version}'s source") from e
    found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz"))
    if done.returncode != 0 or not found:
        raise Unavailable(f"pip could not download llama-cpp-python {version}'s source: "
                          f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return found[0]


def source(cache: Path, *, allow_download: bool = False) -> Path:
    """`vendor/llama.cpp` of the installed llama-cpp-python's source package, extracted once under cache.

    The package is `MREG_LLAMA_CPP_SDIST`, else (with allow_download) downloaded into cache.
    """
    root = cache / f"llama.cpp-{_version()}"
    if _complete(root):
        return root
    archive = os.environ.get(SDIST_ENV)
    if not archive:
        if not allow_download:
            raise Unavailable(f"llama.cpp's source is not here: set {SDIST_ENV} to llama-cpp-python's source "
                              "package (`nox -s tests` downloads it and sets it)")
        archive = str(download(cache))
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tree = Path(tmp) / "tree"
        with tarfile.open(archive) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix) and _wanted(m.name)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(tree, members=members, filter="data")
        if not _complete(tree):
            raise Unavailable(f"{archive} lacks llama.cpp's converter, one of the vocabularies {sorted(VOCABS)} "
                              "or the chat templates")
        if root.exists() and not _complete(root):
            shutil.rmtree(root, ignore_errors=True)  # an earlier, incomplete extraction
        with contextlib.suppress(OSError):
            tree.rename(root)  # fails only when another process has just put a complete tree there
    if not _complete(root):
        raise Unavailable(f"could not extract llama.cpp's source into {root}")
    return root


def templates(root: Path) -> Path:
    """llama.cpp's collection of real chat templates (`models/templates/*.jinja`, one per model family)."""
    return root / "models" / "templates"


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
    #: The other tokenizer.ggml.* keys of the file: special token ids and add-BOS/EOS flags.
    specials: dict[str, Any]
    chat_template: str | None

    @property
    def bos(self) -> int | None:
        value = self.specials.get("tokenizer.ggml.bos_token_id")
        return None if value is None else int(value)

    @property
    def eos(self) -> int | None:
        value = self.specials.get("tokenizer.ggml.eos_token_id")
        return None if value is None else int(value)

    @property
    def size(self) -> int:
        return len(self.tokens)


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A GGUF metadata value as Python data, or default when the key is absent."""
    found = reader.fields.get(key)
    return default if found is None else found.contents()


@functools.cache
def read_vocab(root: Path, name: str) -> RealVocab:
    """The vocabulary file `models/ggml-vocab-NAME.gguf` (parsed once per process: 2.5 s for a BPE one)."""
    from converters.gguf.verify import gguf_reader

    reader = gguf_reader(root / "models" / f"ggml-vocab-{name}.gguf")

    def get(key: str, default: Any = None) -> Any:
        return field(reader, key, default)

    return RealVocab(name, VOCABS[name], get("tokenizer.ggml.model"), get("tokenizer.ggml.pre"),
                     get("tokenizer.ggml.tokens"),
                     get("tokenizer.ggml.token_type"), get("tokenizer.ggml.scores", []),
                     get("tokenizer.ggml.merges", []),
                     {k: get(k) for k in reader.fields if k.startswith("tokenizer.ggml.") and
                      (k.endswith("_token_id") or k.startswith("tokenizer.ggml.add_"))},
                     get("tokenizer.chat_template"))


def cases(root: Path, name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test strings with the ids the model's Hugging Face tokenizer gives (no BOS)."""
    base = root / "models" / f"ggml-vocab-{name}.gguf"
    # Each text ends with the separator line; each line of ids with a newline (an empty line: no ids).
    texts = (base.parent / f"{base.name}.inp").read_bytes().decode("utf-8").split(_SEPARATOR)
    lines = (base.parent / f"{base.name}.out").read_bytes().decode("utf-8").split("\n")
    if texts[-1] != "" or lines[-1] != "":
        raise ValueError(f"{base}.inp / .out do not end as llama.cpp's test files do")
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts[:-1], lines[:-1], strict=True)]


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
    """The tokenizer files of the (base) model the vocabulary comes from, replacing any in dest.

    config.json and generation_config.json get the vocabulary's size and special ids, as the model's have.
    """
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        (dest / name).unlink(missing_ok=True)
    config: dict[str, Any] = {"model_max_length": 2048, "clean_up_tokenization_spaces": False}
    if v.model == "llama":
        (dest / "tokenizer.model").write_bytes(_sentencepiece_model(v))
        config.update(tokenizer_class="LlamaTokenizer", legacy=True, add_bos_token=True, add_eos_token=False,
                      bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token=None)
    elif v.name == "qwen2":
        (dest / "tokenizer.json").write_text(json.dumps(_tokenizer_json(v), ensure_ascii=False), encoding="utf-8")
        config.update(tokenizer_class="Qwen2Tokenizer", add_prefix_space=False, bos_token=None,
                      eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token=None, errors="replace",
                      split_special_tokens=False)
    else:
        (dest / "tokenizer.json").write_text(json.dumps(_tokenizer_json(v), ensure_ascii=False), encoding="utf-8")
        config.update(tokenizer_class="PreTrainedTokenizerFast", bos_token=v.tokens[v.bos or 0],
                      eos_token=v.tokens[v.eos or 0])
    if v.chat_template:
        config["chat_template"] = v.chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    ids = {"bos_token_id": v.bos, "eos_token_id": v.eos}
    for name in ("config.json", "generation_config.json"):
        path = dest / name
        if path.is_file():
            doc = {k: val for k, val in json.loads(path.read_text()).items() if k != "pad_token_id"}
            doc.update(ids, **({"vocab_size": v.size} if name == "config.json" else {}))
            path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def build_model(v: RealVocab, dest: Path, **kw: Any) -> Path:
    """A tiny random model of the vocabulary's architecture carrying its tokenizer (tied embeddings for Qwen,
    as its small models have); keyword arguments go to tiny_models.build_tiny_llama."""
    from support.tiny_models import build_tiny_llama

    build_tiny_llama(dest, model_type=v.architecture, vocab_size=v.size, tie_word_embeddings=v.architecture == "qwen2",
                     **kw)
    write_tokenizer(v, dest)
    return dest


if __name__ == "__main__":
    # `python tests/support/llama_cpp_source.py DIR`: download the source package into DIR, print its path.
    print(download(Path(sys.argv[1]).absolute()))
