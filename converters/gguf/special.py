"""A tokenizer's special tokens, add-BOS/EOS/SEP flags, merges, normalizer flags and chat templates, read from a
Hugging Face snapshot the way llama.cpp's converter (its gguf-py `SpecialVocab`) reads them at the pinned version.

mreg reads them itself rather than through the `gguf` package from PyPI: that package lags the gguf-py inside
llama.cpp's source, and its older reader writes different metadata for the same checkpoint (it omits
`add_eos_token` for a byte-level post-processor, Qwen2.5's case, and ignores the post-processor's word on BOS).
The rules, in order of precedence:
- flags: the tokenizer.json post-processor first (ByteLevel adds nothing; RobertaProcessing adds BOS, EOS and
  SEP; TemplateProcessing adds what its single/pair templates start, end and separate with), then
  tokenizer_config.json's `add_*_token`;
- ids: tokenizer_config.json's `*_token` names found among tokenizer.json's added tokens, then config.json's
  `*_token_id` (or its text_config's), the first answer for each kind winning; ids past the vocabulary dropped;
- chat templates: as transformers reads them (see `_chat_template`: the one place mreg differs from llama.cpp).
Files that are not JSON objects are refused (`registry.convert.configs.InvalidConfig`, exit 4, naming the file).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.convert.configs import read_object
from registry.errors import UsageError

#: The kinds read by default, and the GGUF key of each id (llama.cpp spells "seperator" so).
ID_KEYS = {"bos": "bos", "eos": "eos", "unk": "unknown", "sep": "seperator", "pad": "padding", "cls": "cls",
           "mask": "mask", "eot": "eot", "eom": "eom"}
_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


class InvalidTokenizerFile(UsageError):
    """A tokenizer or config file that does not parse as what it must be."""


def _merges(raw: Any) -> list[str]:
    """tokenizer.json merges as "a b" strings; the pair form (transformers 4.45+) with spaces shifted by 256,
    as llama.cpp stores a space inside a merge part."""
    if not isinstance(raw, list) or not raw:
        return []
    if all(isinstance(m, str) for m in raw):
        return list(raw)
    if all(isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m) for m in raw):
        return [" ".join(p.replace(" ", "\u0120") for p in pair) for pair in raw]
    raise InvalidTokenizerFile("tokenizer.json's merges are neither strings nor pairs of strings",
                               hint="re-pull the repository")


@dataclass
class Special:
    """What llama.cpp's converter writes about a tokenizer beside its tokens."""

    merges: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    add: dict[str, bool] = field(default_factory=dict)
    chat_template: str | list[dict[str, str]] | None = None
    lowercase: bool | None = None
    strip_accents: bool | None = None
    kinds: tuple[str, ...] = _KINDS

    def metadata(self) -> Iterator[tuple[str, Any]]:
        """The GGUF keys with their values."""
        if self.merges:
            yield "tokenizer.ggml.merges", self.merges
        for kind, tid in self.ids.items():
            yield f"tokenizer.ggml.{ID_KEYS[kind]}_token_id", tid
        for kind, flag in self.add.items():
            if kind in ("bos", "eos", "sep"):
                yield f"tokenizer.ggml.add_{kind}_token", flag
        yield from _templates(self.chat_template)
        if self.lowercase is not None:
            yield "tokenizer.ggml.normalizer.lowercase", self.lowercase
        if self.strip_accents is not None:
            yield "tokenizer.ggml.normalizer.strip_accents", self.strip_accents

    def default_template(self) -> str | None:
        """The template `mreg check` renders: the only one, or the one named "default"."""
        if isinstance(self.chat_template, list):
            return next((t["template"] for t in self.chat_template if t.get("name") == "default"), None)
        return self.chat_template


def _templates(value: str | list[dict[str, str]] | None) -> Iterator[tuple[str, Any]]:
    """tokenizer.chat_template, and for named templates tokenizer.chat_template.NAME and their list."""
    if value is None:
        return
    if isinstance(value, str):
        yield "tokenizer.chat_template", value
        return
    default, names = None, []
    for choice in value:
        name = "".join(c if c.isascii() and c.isalnum() else "_" for c in str(choice.get("name", "")))
        template = choice.get("template")
        if not name or template is None:
            continue
        if name == "default":
            default = template
        elif name not in names:
            names.append(name)
            yield f"tokenizer.chat_template.{name}", template
    if names:
        yield "tokenizer.chat_templates", sorted(names)
    if default is not None:
        yield "tokenizer.chat_template", default


def _normalizer(special: Special, normalizer: Any) -> None:
    if not isinstance(normalizer, dict):
        return
    kind = normalizer.get("type")
    if kind == "Lowercase":
        special.lowercase = True
    elif kind == "StripAccents":
        special.strip_accents = True
    elif kind == "BertNormalizer":
        if "lowercase" in normalizer:
            special.lowercase = normalizer["lowercase"]
        if "strip_accents" in normalizer:
            special.strip_accents = normalizer["strip_accents"]
    elif kind == "Sequence":
        for step in normalizer.get("normalizers") or []:
            _normalizer(special, step)


def _first_special(template: list[Any], at: int) -> Any:
    entry = template[at] if template else {}
    return (entry.get("SpecialToken") or {}).get("id") if isinstance(entry, dict) else None


class _Names:
    """tokenizer_config.json's special token names, as the post-processor amends them."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config
        get = (config or {}).get
        self.bos, self.cls, self.eos, self.sep = get("bos_token"), get("cls_token"), get("eos_token"), get("sep_token")
        if config is not None:
            if not self.bos and self.cls:
                config["bos_token"] = self.bos = self.cls
            if not self.eos and self.sep:
                config["eos_token"] = self.eos = self.sep

    def set(self, kind: str, value: Any) -> None:
        if self.config is not None:
            self.config[f"{kind}_token"] = value
        setattr(self, kind, value)


def _template_processing(special: Special, names: _Names, processor: dict[str, Any]) -> None:
    """What a TemplateProcessing adds: its single template's first and last special tokens, and a separator
    between the pair template's sequences (the simple layouts real tokenizers use)."""
    single, pair = list(processor.get("single") or []), list(processor.get("pair") or [])
    first = last = None
    if len(single) > 1:
        first = _first_special(single, 0)
        if first:
            if names.config is None:
                names.bos = first
            elif first not in (names.bos, names.cls):
                if not names.bos:
                    names.set("bos", first)
                if not names.cls:
                    names.set("cls", first)
            special.add["bos"] = first in (names.bos, names.cls)
        last = _first_special(single, -1)
        if last:
            if names.config is None:
                names.eos = last
            elif last != names.eos:
                # The template ends with another token than EOS: the old EOS becomes EOT (or EOM).
                for extra in ("eot", "eom"):
                    if extra not in special.kinds:
                        special.kinds = (*special.kinds, extra)
                        names.set(extra, names.eos)
                        break
                names.set("eos", last)
            special.add["eos"] = last == names.eos
    if not pair:
        return
    start = 1 if first and _first_special(pair, 0) == first else 0
    stop = -1 if last and _first_special(pair, -1) == last else None
    pair = pair[start:stop]
    if not pair:
        return
    a = (pair[0].get("Sequence") or {}).get("id") if isinstance(pair[0], dict) else None
    b = (pair[-1].get("Sequence") or {}).get("id") if isinstance(pair[-1], dict) else None
    middle = pair[1:-1]
    if a != "A" or b != "B" or not middle:
        return
    add_sep = False
    entry = _first_special(middle, 0)
    if entry and entry in (names.sep, names.eos) and not last:
        add_sep = True
    if len(middle) == 2:
        entry = _first_special(middle, 1)
        if entry and entry in (names.sep, names.eos):
            add_sep = True
    special.add["sep"] = add_sep
    if add_sep and not names.sep and names.config is not None:
        names.set("sep", names.eos)


def _post_processor(special: Special, names: _Names, post: Any) -> None:
    if not isinstance(post, dict):
        return
    for processor in post.get("processors", [post]):
        if not isinstance(processor, dict):
            continue
        kind = processor.get("type")
        if kind == "ByteLevel":
            special.add.setdefault("bos", False)
            special.add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            special.add.update(bos=True, eos=True, sep=True)
            if not names.cls and names.config is not None:
                names.set("cls", (processor.get("cls") or [names.bos])[0])
            if not names.sep and names.config is not None:
                names.set("sep", (processor.get("sep") or [names.eos])[0])
        elif kind == "TemplateProcessing":
            _template_processing(special, names, processor)


def _chat_template(directory: Path, config: dict[str, Any] | None) -> str | list[dict[str, str]] | None:
    """The snapshot's chat templates, read as transformers 5's tokenizer reads them (what `apply_chat_template`
    renders with, so what mreg stores and checks).

    `chat_template.jinja` and `additional_chat_templates/NAME.jinja`, when any exists, replace tokenizer_config.json's
    `chat_template` (a string, or a list of {name, template}); then chat_template.json's. Here mreg parts from
    llama.cpp's converter on purpose: its gguf-py lets the config win and skips the files when there is no config,
    so its GGUF can carry a template other than the one transformers renders. Files are read as text (universal
    newlines), as transformers reads them.
    """
    found: dict[str, str] = {}
    default, extra = directory / "chat_template.jinja", directory / "additional_chat_templates"
    if default.is_file():
        found["default"] = default.read_text(encoding="utf-8")
    if extra.is_dir():
        found.update((p.name.removesuffix(".jinja"), p.read_text(encoding="utf-8"))
                     for p in sorted(extra.glob("*.jinja")) if p.is_file())
    if found:
        if list(found) == ["default"]:
            return found["default"]
        return [{"name": k, "template": v} for k, v in found.items()]
    for doc in (config, read_object(directory / "chat_template.json")):
        template = (doc or {}).get("chat_template")
        if isinstance(template, str):
            return template
        if isinstance(template, list):
            return [{"name": t["name"], "template": t["template"]} for t in template
                    if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)]
    return None


def _set(special: Special, n_vocab: int, kind: str, tid: Any) -> None:
    if not isinstance(tid, int) or isinstance(tid, bool) or kind in special.ids:
        return
    if tid < 0:
        raise InvalidTokenizerFile(f"the {kind} token id is negative ({tid})", hint="fix the model's config.json")
    if tid < n_vocab:
        special.ids[kind] = tid


def read_special(directory: Path, n_vocab: int, load_merges: bool,
                 tokenizer: dict[str, Any] | None = None, model_config: dict[str, Any] | None = None) -> Special:
    """Everything beside the tokens that llama.cpp's converter writes for the tokenizer in `directory`
    (`tokenizer`, `model_config`: tokenizer.json and config.json already parsed by the caller, not read again)."""
    special = Special()
    tokenizer = tokenizer if tokenizer is not None else read_object(directory / "tokenizer.json")
    config = read_object(directory / "tokenizer_config.json")
    added: list[Any] = []
    if tokenizer is not None:
        if load_merges:
            special.merges = _merges((tokenizer.get("model") or {}).get("merges"))
        _normalizer(special, tokenizer.get("normalizer"))
        added = [t for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)]
        names = _Names(config)
        _post_processor(special, names, tokenizer.get("post_processor"))
    try:
        special.chat_template = _chat_template(directory, config)
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidTokenizerFile(f"cannot read the chat template: {e}", hint="re-pull the repository") from e
    if config is not None:
        for kind in special.kinds:
            flag = config.get(f"add_{kind}_token")
            if isinstance(flag, bool):
                special.add.setdefault(kind, flag)
            entry = config.get(f"{kind}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                tid = next((t.get("id") for t in added if t.get("content") == content), None)
                _set(special, n_vocab, kind, tid)
    if model_config is None:
        model_config = read_object(directory / "config.json")
    if model_config is not None:
        text_config = model_config.get("text_config")
        for kind in special.kinds:
            tid = model_config.get(f"{kind}_token_id")
            if tid is None and isinstance(text_config, dict):
                tid = text_config.get(f"{kind}_token_id")
            _set(special, n_vocab, kind, tid)
    if load_merges and not special.merges and (directory / "merges.txt").is_file():
        special.merges = _merges_txt(directory / "merges.txt")
    return special


def _merges_txt(path: Path) -> list[str]:
    """merges.txt (GPT-2's layout: an optional "#version" line, then one "a b" pair per line)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append(f"{parts[0]} {parts[1]}")
    return out
