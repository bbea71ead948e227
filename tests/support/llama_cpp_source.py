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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from converters.gguf.vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED

SDIST_ENV = "MREG_LLAMA_CPP_SDIST"
#: The vocabularies the tests use, by llama.cpp's name, with the architecture they come from.
#: Every vocabulary file in llama.cpp's models/ that mreg can describe; a tiny model of that architecture carries
#: it in the tests (the Qwen ones on Qwen2, as their models are; the rest on Llama: the tokenizer keys are
#: the same whatever the architecture).
VOCABS = {"llama-spm": "llama", "llama-bpe": "llama", "qwen2": "qwen2", "qwen35": "qwen2", "phi-3": "llama",
          "baichuan": "llama", "gpt-2": "llama", "mpt": "llama", "gpt-neox": "llama", "starcoder": "llama",
          "refact": "llama", "command-r": "llama", "falcon": "llama", "deepseek-coder": "llama",
          "deepseek-llm": "llama"}
#: The vocabulary files mreg refuses, with the reason (README's tokenizer section lists them).
UNSUPPORTED = {
    "bert-bge": "WordPiece (tokenizer.ggml.model bert): an encoder's tokenizer; mreg's GGUF covers decoders",
    "nomic-bert-moe": "Unigram (tokenizer.ggml.model t5) of an encoder; mreg's GGUF covers decoders",
    "gemma-4": "Gemma 4's own BPE (tokenizer.ggml.model gemma4) belongs to the gemma4 architecture, not converted",
    "aquila": "an old file with no pre-tokenizer and no test strings: Aquila's tokenizer.json layout cannot be "
              "recovered from it, and llama.cpp's converter has no hash for it either",
}
#: The files whose presence says the extraction is complete.
_SENTINELS = ("llama-spm", "llama-bpe", "qwen2")
#: The file in llama.cpp's converter that holds the pre-tokenizer hashes (`get_vocab_base_pre`).
PRE_TOKENIZER_SOURCE = "conversion/base.py"
_SEPARATOR = "\n__ggml_vocab_test__\n"


T = TypeVar("T")


class Unavailable(Exception):
    """The source package could not be had (no llama-cpp-python installed, or pip could not download it)."""


def built_or_skip(request: Any, tmp_path_factory: Any, name: str, make: Callable[[Path], T]) -> T:
    """A fixture's `make(dir)` in pytest's cache directory `name` (a temporary one without a cache), built once across
    runs; Unavailable skips the test where the sdist is not named (pytest run by hand) and fails it where it is."""
    import pytest

    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)
    try:
        return make(where)
    except Unavailable as e:
        if os.environ.get(SDIST_ENV):
            raise
        pytest.skip(str(e))


#: One of the real chat templates (`models/templates/*.jinja`), to tell a tree extracted with them.
QWEN25_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


def _wanted(name: str) -> bool:
    return name.endswith(".py") or "/gguf-py/" in name or "/models/ggml-vocab-" in name or (
        "/models/templates/" in name and name.endswith(".jinja"))


def _complete(root: Path) -> bool:
    """The converter, the vocabularies with their test files, and the chat templates are there."""
    vocab_files = [f"ggml-vocab-{name}.gguf{suffix}" for name in _SENTINELS for suffix in ("", ".inp", ".out")]
    return ((root / "convert_hf_to_gguf.py").is_file() and (root / PRE_TOKENIZER_SOURCE).is_file()
            and all((root / "models" / f).is_file() for f in vocab_files)
            and (root / "models" / "templates" / QWEN25_TEMPLATE).is_file())


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
            raise Unavailable(f"{archive} lacks llama.cpp's converter, one of the vocabularies {_SENTINELS} "
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

    return RealVocab(name, VOCABS.get(name, "llama"), get("tokenizer.ggml.model"), get("tokenizer.ggml.pre"),
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


def _byte_level(**kw: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True, **kw}


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _digits(individual: bool) -> dict[str, Any]:
    return {"type": "Digits", "individual_digits": individual}


_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
#: DeepSeek LLM's letters (as its tokenizer.json spells the class; escaped here for legibility).
_DEEPSEEK_LLM_LETTERS = (
    "\\s?"
    "[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")


@dataclass(frozen=True)
class BPELayout:
    """How a model family's tokenizer.json is laid out: what the vocabulary file cannot say."""

    pre_tokenizer: dict[str, Any]
    normalizer: dict[str, Any] | None = None
    #: The tokenizer adds BOS (its post-processor and tokenizer_config's add_bos_token).
    adds_bos: bool = False
    ignore_merges: bool = False


def _seq(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": list(steps)}


_NFC = {"type": "NFC"}
#: Each byte-level BPE family's layout, from the tokenizer.json of the model llama.cpp took the vocabulary from.
BPE_LAYOUTS = {
    "gpt-2": BPELayout(_byte_level()),
    "mpt": BPELayout(_byte_level(), _NFC),
    "gpt-neox": BPELayout(_byte_level(), _NFC),
    "llama-bpe": BPELayout(_seq(_split(_LLAMA3_SPLIT), _byte_level(use_regex=False)), adds_bos=True,
                           ignore_merges=True),
    "qwen2": BPELayout(_seq(_split(_QWEN2_SPLIT), _byte_level(use_regex=False, trim_offsets=False)), _NFC),
    "qwen35": BPELayout(_seq(_split(_QWEN35_SPLIT), _byte_level(use_regex=False, trim_offsets=False))),
    "starcoder": BPELayout(_seq(_digits(True), _byte_level())),
    "refact": BPELayout(_seq(_digits(True), _byte_level())),
    "command-r": BPELayout(_seq(_digits(True), _byte_level()), _NFC, adds_bos=True),
    "falcon": BPELayout(_seq({"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(), _digits(False),
                             _split("[0-9][0-9][0-9]"))),
    "deepseek-coder": BPELayout(_seq(_split("[\r\n]"), _split(r"\s?\p{L}+"), _split(r"\s?\p{P}+"), _split(_CJK),
                                     _digits(True), _byte_level(use_regex=False)), {"type": "Sequence",
                                                                                   "normalizers": []},
                                adds_bos=True),
    "deepseek-llm": BPELayout(_seq(_split("[\r\n]"), _split(_DEEPSEEK_LLM_LETTERS),
                                   _split(r"\s?[!-/:-~！-／：-～‘-‟　-。]+"), _split(r"\s+$"), _split(_CJK),
                                   _digits(False), _byte_level(use_regex=False)),
                              {"type": "Sequence", "normalizers": []}, adds_bos=True),
}


def _tokenizer_json(v: RealVocab) -> dict[str, Any]:
    """tokenizer.json as the family publishes it (its layout; this vocabulary and these merges)."""
    layout = BPE_LAYOUTS[v.name]
    # Special tokens are added tokens that no normalizer touches; other added ones are normalized (transformers'
    # default). Qwen's model vocabulary leaves its added tokens out; the others list them in it too.
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": ty != CONTROL, "special": ty == CONTROL}
             for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True))
             if ty in (CONTROL, USER_DEFINED) and t != f"[PAD{i}]"]  # padding: ids no file names
    kept = (NORMAL,) if v.architecture == "qwen2" else (NORMAL, CONTROL, USER_DEFINED)
    vocab = {t: i for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True)) if ty in kept and t != f"[PAD{i}]"}
    post: dict[str, Any] = _byte_level(trim_offsets=False)
    if layout.adds_bos:
        bos = v.tokens[v.bos or 0]
        post = {"type": "Sequence", "processors": [
            _byte_level(add_prefix_space=True, trim_offsets=False),
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [v.bos], "tokens": [bos]}}}]}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": layout.normalizer, "pre_tokenizer": layout.pre_tokenizer,
        "post_processor": post, "decoder": _byte_level(),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": layout.ignore_merges, "vocab": vocab, "merges": v.merges},
    }


def _pieces(v: RealVocab) -> int:
    """How many of the vocabulary's tokens are the SentencePiece model's own pieces (the rest were added)."""
    return 1 + max(i for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True))
                   if ty in (NORMAL, BYTE) or (ty == UNKNOWN and t != f"[PAD{i}]"))


def _sentencepiece_model(v: RealVocab) -> bytes:
    """tokenizer.model as Llama 2 publishes it: BPE with byte fallback, identity normalization, a dummy prefix.

    Its pieces carry SentencePiece's own types: <unk> UNKNOWN, <s> and </s> CONTROL (the vocabulary file may
    show them otherwise: llama.cpp's converter re-types them from tokenizer_config.json's added tokens)."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    proto = spm.ModelProto()
    n = _pieces(v)
    natural = {"<unk>": UNKNOWN, "<s>": CONTROL, "</s>": CONTROL}
    for token, score, kind in zip(v.tokens[:n], v.scores[:n], v.types[:n], strict=True):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = token, score, natural.get(token, kind)
    t = proto.trainer_spec
    t.model_type, t.vocab_size, t.byte_fallback = spm.TrainerSpec.BPE, n, True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = v.tokens.index("<unk>"), 1, 2, -1
    t.split_digits, t.allow_whitespace_only_pieces = True, True
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix, norm.remove_extra_whitespaces, norm.escape_whitespaces = (
        "identity", True, False, True)
    return bytes(proto.SerializeToString())


def _added_tokens_decoder(v: RealVocab) -> dict[str, Any]:
    """tokenizer_config.json's added tokens of a SentencePiece model: those past its pieces, and the pieces the
    vocabulary file shows re-typed (Phi-3 marks <unk> and <s> special, </s> not)."""
    n = _pieces(v)
    natural = {"<unk>": UNKNOWN, "<s>": CONTROL, "</s>": CONTROL}
    out: dict[str, Any] = {}
    for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True)):
        retyped = i < n and t in natural and ty != natural[t]
        if (i >= n and ty in (CONTROL, USER_DEFINED)) or retyped:
            out[str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": ty == CONTROL}
    return out


def _token(v: RealVocab, key: str) -> str | None:
    tid = v.specials.get(f"tokenizer.ggml.{key}_token_id")
    return None if tid is None else v.tokens[int(tid)]


def write_tokenizer(v: RealVocab, dest: Path) -> None:
    """The tokenizer files of the (base) model the vocabulary comes from, replacing any in dest.

    config.json and generation_config.json get the vocabulary's size and special ids, as the model's have;
    tokenizer_config.json names the special tokens and add-BOS/EOS flags the vocabulary file records.
    """
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        (dest / name).unlink(missing_ok=True)
    config: dict[str, Any] = {"model_max_length": 2048, "clean_up_tokenization_spaces": False}
    if v.model == "llama":
        (dest / "tokenizer.model").write_bytes(_sentencepiece_model(v))
        config.update(tokenizer_class="LlamaTokenizer", legacy=True, add_bos_token=True, add_eos_token=False,
                      pad_token=None, added_tokens_decoder=_added_tokens_decoder(v))
    else:
        (dest / "tokenizer.json").write_text(json.dumps(_tokenizer_json(v), ensure_ascii=False), encoding="utf-8")
        config.update(tokenizer_class="Qwen2Tokenizer" if v.architecture == "qwen2" else "PreTrainedTokenizerFast")
        for flag in ("bos", "eos"):
            recorded = v.specials.get(f"tokenizer.ggml.add_{flag}_token")
            if recorded is not None:
                config[f"add_{flag}_token"] = bool(recorded)
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                      ("padding", "pad_token")):
        token = _token(v, key)
        if token is not None:
            config[name] = token
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


def pre_tokenizer_table(root: Path) -> dict[str, Any]:
    """llama.cpp's converter's pre-tokenizer table: its check text and each token-id hash with its name and the
    model it was taken from, parsed from `get_vocab_base_pre` (the data mreg ships as
    converters/gguf/data/pre_tokenizers.json)."""
    import ast
    import re

    text = (root / PRE_TOKENIZER_SOURCE).read_text(encoding="utf-8")
    start = text.index("def get_vocab_base_pre")
    body = text[start:text.index("Marker: End get_vocab_base_pre", start)]
    found = re.search(r"\n\s+chktxt = (.+)\n", body)
    if found is None:
        raise ValueError(f"{PRE_TOKENIZER_SOURCE}: get_vocab_base_pre has no chktxt")
    check_text = ast.literal_eval(found.group(1))
    hashes = [{"hash": h, "name": name, "ref": (re.findall(r"# ref: (\S+)", refs) or [""])[0]} for h, refs, name in
              re.findall(r'if chkhsh == "([0-9a-f]{64})":\n((?:\s+#[^\n]*\n)*)\s+res = "([^"]+)"', body)]
    if len(hashes) != body.count("if chkhsh =="):
        raise ValueError(f"{PRE_TOKENIZER_SOURCE}: a chkhsh branch is not of the form `res = NAME`")
    return {"check_text": check_text, "hashes": hashes}


_REFERENCE_DRIVER = """
import json, runpy, sys
for src, out in json.loads(sys.argv[1]):
    sys.argv = ["convert_hf_to_gguf.py", src, "--vocab-only", "--outfile", out]
    try:
        runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
    except SystemExit as e:
        if e.code:
            print(f"FAILED {src}: exit {e.code}", flush=True)
    except Exception as e:
        print(f"FAILED {src}: {type(e).__name__}: {e}", flush=True)
"""


def reference_vocab_files(root: Path, sources: dict[str, Path], dest: Path) -> dict[str, Path | str]:
    """llama.cpp's own converter (`convert_hf_to_gguf.py --vocab-only`, with its own gguf-py) on each source, in
    one process (torch and transformers load once): name -> the GGUF it wrote, or the reason it wrote none."""
    dest.mkdir(parents=True, exist_ok=True)
    pairs = [(str(src), str(dest / f"{name}.gguf")) for name, src in sources.items()]
    env = {**os.environ, "PYTHONPATH": "gguf-py", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _REFERENCE_DRIVER, json.dumps(pairs)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    failed = {line.split(": ", 1)[0][len("FAILED "):]: line.split(": ", 1)[1]
              for line in done.stdout.splitlines() if line.startswith("FAILED ")}
    out: dict[str, Path | str] = {}
    for name, src in sources.items():
        path = dest / f"{name}.gguf"
        reason = failed.get(str(src)) or (None if path.is_file() else (done.stderr.strip().splitlines() or ["?"])[-1])
        out[name] = reason if reason else path
    return out


if __name__ == "__main__":
    # `python tests/support/llama_cpp_source.py DIR`: download the source package into DIR, print its path.
    # `python tests/support/llama_cpp_source.py --pre-tokenizers DIR`: print the pre-tokenizer table as JSON
    # (with the source named; regenerates converters/gguf/data/pre_tokenizers.json).
    if sys.argv[1] == "--pre-tokenizers":
        table = pre_tokenizer_table(source(Path(sys.argv[2]).absolute(), allow_download=True))
        print(json.dumps({"source": f"llama.cpp {PRE_TOKENIZER_SOURCE} get_vocab_base_pre, from llama-cpp-python "
                                    f"{_version()}'s source package", **table}, indent=1, ensure_ascii=False))
    else:
        print(download(Path(sys.argv[1]).absolute()))
