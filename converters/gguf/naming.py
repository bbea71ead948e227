"""`general.name` as llama.cpp's converter derives it from the source (gguf-py's `Metadata.load` and its fallback).

llama.cpp applies rules by name when it loads a file (its Phi-3 vocabulary path triggers on "phi3" in
`general.name`), so the name is the model's, never the one it has in the store (`--name`): a store name must not
change how llama.cpp reads the file. In order, the first found:
1. the model card's (README.md's YAML front matter) `name`, then its `model_name`, as written;
2. config.json's `_name_or_path` when it is a repository id (at most one slash), its name part as a title;
3. the directory the model came from: the last part of the source's repository id or path, as a title
   (llama.cpp's converter reads the directory it is given; mreg's is the repository's name, never a cache path).
A title is llama.cpp's `id_to_title`: `Llama-2-7b-hf` -> `Llama 2 7b Hf`.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.convert.configs import read_object

if TYPE_CHECKING:
    from manifests import SourceInfo

#: How much of README.md is read for its front matter (model cards put it first; a card is a few KiB).
CARD_BYTES = 256 * 1024


def id_to_title(text: str) -> str:
    """llama.cpp's title form: words capitalized unless acronyms, version or size figures (`v2`, `7b`)."""
    words = text.strip().replace("-", " ").split()
    return " ".join(w.title() if w.islower() and not re.match(r"^(v\d+(?:\.\d+)*|\d.*)$", w) else w for w in words)


def _full_name(model_id: str) -> str:
    """The name part of a repository id (`org/name` -> `name`); a sentence is a name as it is."""
    if " " in model_id or "/" not in model_id:
        return model_id
    return model_id.split("/", 1)[1]


def model_card(directory: Path) -> dict[str, Any]:
    """README.md's YAML front matter as llama.cpp reads it ({} when there is none or it does not parse)."""
    yaml: Any = importlib.import_module("yaml")  # PyYAML ships no type stubs

    path = directory / "README.md"
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        raw = f.read(CARD_BYTES)
    if len(raw) == CARD_BYTES:  # cut at the last whole line: the bound never splits a character
        raw = raw[:raw.rfind(b"\n") + 1]
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return {}  # llama.cpp's converter stops there; mreg goes on to the next source of a name
    if not lines or lines[0] != "---":
        return {}
    end = lines.index("---", 1) if "---" in lines[1:] else len(lines)
    body = "\n".join(lines[1:end]) + "\n"
    # llama.cpp's two fixes: the Norway problem, and tabs some cards indent with.
    body = body.replace("- no\n", '- "no"\n').replace("\t", "  ")
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError:
        return {}  # llama.cpp's converter stops there; mreg goes on to the next source of a name
    return data if isinstance(data, dict) else {}


def source_name(source: SourceInfo) -> str:
    """The name of the directory a source came from: a local import's own directory (its `repo` is a slug with a
    digest), else the repository id's name part."""
    if source.kind == "local" and source.requested_revision:
        return Path(source.requested_revision).name
    return source.repo.rstrip("/").rsplit("/", 1)[-1]


def general_name(directory: Path, source: str, config: dict[str, Any] | None = None) -> str:
    """The model's name for `general.name`: the card's, config.json's repository id (`config`: config.json when
    already read), or `source` (the name of the directory it came from, `source_name`) as a title."""
    card = model_card(directory)
    for key in ("name", "model_name"):
        value = card.get(key)
        if isinstance(value, str) and value.strip():
            return value
    path = ((config if config is not None else read_object(directory / "config.json")) or {}).get("_name_or_path")
    if isinstance(path, str) and path.strip() and path.count("/") <= 1 and _full_name(path):
        return id_to_title(_full_name(path))
    return id_to_title(source) or "model"
