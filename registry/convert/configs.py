"""A snapshot's JSON configs, read as hostile input: each must be a JSON object, as every loader expects.

What vLLM, TGI, transformers and mreg's own converters read first: a config that is not JSON
(or not UTF-8, or nested too deep for a parser), or JSON that is not an object, is
`InvalidConfig` (exit 4) naming the file, before a converter reads anything else.
safetensors headers are checked by `registry.convert.safetensors.read_header`, shard indexes against
their shards by `registry.convert.shards`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from registry.errors import IntegrityError

#: Files the loaders read as a JSON object, by name (at any depth: a pipeline keeps one per component).
CONFIG_FILES = frozenset({"config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
                          "special_tokens_map.json", "preprocessor_config.json", "processor_config.json",
                          "added_tokens.json", "chat_template.json"})
#: Past this a "config" is not one (the largest tokenizer.json files are tens of MB); it is not read whole.
MAX_CONFIG = 256 << 20


class InvalidConfig(IntegrityError):
    """A config file of the snapshot that no loader can read."""

    def __init__(self, label: str, problem: str) -> None:
        super().__init__(f"{label} {problem}", hint="the checkpoint is damaged: fetch it again from its source, or "
                                                     "fix the file there; nothing was published")


def is_config(label: str) -> bool:
    """Whether a snapshot path is a config that loaders parse as a JSON object."""
    name = PurePosixPath(label).name
    return name in CONFIG_FILES or name.endswith(".safetensors.index.json")


def check_configs(files: Mapping[str, Path]) -> None:
    """Every config of the snapshot (label -> path) is a JSON object, InvalidConfig naming the first that is not;
    then every shard index agrees with its shards (`registry.convert.shards`)."""
    from registry.convert.shards import check_indexes  # it reads indexes with this module's reader

    for label, path in sorted(files.items()):
        if is_config(label):
            read_object(path, label)
    check_indexes(files)


def read_object(path: Path, label: str | None = None) -> dict[str, Any] | None:
    """The JSON object in `path` (None when there is no such file), or InvalidConfig naming `label`."""
    if not path.is_file():
        return None
    label = label or path.name
    size = path.stat().st_size
    if size > MAX_CONFIG:
        raise InvalidConfig(label, f"is {size} bytes, too large to be a config")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; RecursionError: deep nesting
        raise InvalidConfig(label, f"is not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    if not isinstance(doc, dict):
        raise InvalidConfig(label, f"is JSON but not an object (it is {_JSON_KIND.get(type(doc), 'a number')})")
    return doc


_JSON_KIND = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
