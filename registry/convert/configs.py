"""A snapshot's JSON configs, read as hostile input: each must be a JSON object, as every loader expects.

What vLLM, TGI, transformers and mreg's own converters read first: a config that is not JSON
(or not UTF-8, or nested too deep for a parser), or JSON that is not an object, is
`InvalidConfig` (exit 4) naming the file, before a converter reads anything else.
safetensors headers are checked by `registry.convert.safetensors.read_header`.

Shard indexes (`*.safetensors.index.json`) must agree exactly with their shards. An engine
(transformers, vLLM, TGI) opens the shards an index names and looks each tensor up in the shard
it is mapped to. So an index is refused when it names a path that leaves the snapshot
(absolute, or climbing out with `..`: `UnsafeInput`, exit 8, as a symlink out of a source is), or
when it disagrees with the shards' headers (`ShardIndexMismatch`, exit 4): a shard the snapshot
lacks, a tensor no shard holds, a tensor of a shard that the index leaves out or maps elsewhere,
or a tensor held by two of its shards. Paths are relative to the index's own directory, as
transformers joins them (a diffusers pipeline keeps one index per component folder).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from registry.convert.safetensors import read_header
from registry.errors import IntegrityError, UnsafeInput

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
    return name in CONFIG_FILES or name.endswith(INDEX_SUFFIX)


def check_configs(files: Mapping[str, Path], read: Mapping[str, dict[str, Any]] | None = None) -> None:
    """Every config of the snapshot (label -> path) is a JSON object, InvalidConfig naming the first that is not;
    then every shard index agrees with its shards (`check_indexes`). `read`: configs already read (as objects),
    by label, not read again."""
    for label, path in sorted(files.items()):
        if is_config(label) and label not in (read or {}):
            read_object(path, label)
    check_indexes(files)


def read_config(path: Path) -> dict[str, Any] | None:
    """A model's config.json as a JSON object, or None when it is absent or is not one (whoever needs it then
    reads it again through `check_configs`, which names the damage)."""
    try:
        return read_object(path, "config.json")
    except (InvalidConfig, OSError):
        return None


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


#: Shard indexes end so.
INDEX_SUFFIX = ".safetensors.index.json"
#: Problems named in one error line (the rest are counted).
_SHOWN = 3


class ShardIndexMismatch(IntegrityError):
    """A shard index that does not describe the shards beside it."""

    def __init__(self, label: str, problems: list[str]) -> None:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        shown = "; ".join(problems[:_SHOWN])
        shown = shown if len(shown) <= 300 else shown[:299] + "…"  # one line a person reads
        super().__init__(f"{label} disagrees with its shards: {shown}{more}",
                         hint="an engine that follows this index would fail or load the wrong tensors: fetch the "
                              "checkpoint again from its source, or fix the index there; nothing was published")


def check_indexes(files: Mapping[str, Path]) -> None:
    """Every shard index of a snapshot (label -> path) against the headers of the shards it names."""
    for label in sorted(files):
        if label.endswith(INDEX_SUFFIX):
            check_index(label, files)


def check_index(label: str, files: Mapping[str, Path]) -> None:
    """One index against its shards: UnsafeInput for a path out of the snapshot, ShardIndexMismatch otherwise."""
    doc = read_object(files[label], label) or {}
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InvalidConfig(label, "has no weight_map (an object of tensor name -> shard file)")
    folder = posixpath.dirname(label)
    shard_of: dict[str, str] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise InvalidConfig(label, f"maps tensor {_short(tensor)} to {_short(shard)}, not a file name")
        shard_of[tensor] = _inside(label, folder, shard)
    problems: list[str] = []
    holders: dict[str, str] = {}
    for shard in sorted(set(shard_of.values())):
        if shard not in files:  # named once here; its tensors are not judged
            problems.append(f"shard {_short(shard)} is not in the snapshot")
            continue
        for tensor in read_header(files[shard], shard):
            if tensor in holders:
                problems.append(f"tensor {_short(tensor)} is in both {_short(holders[tensor])} and {_short(shard)}")
            else:
                holders[tensor] = shard
    missing = {s for s in shard_of.values() if s not in files}
    for tensor, shard in shard_of.items():
        if shard in missing:
            continue
        if tensor not in holders:
            problems.append(f"tensor {_short(tensor)} is mapped to {_short(shard)}, which does not hold it")
        elif holders[tensor] != shard:
            problems.append(f"tensor {_short(tensor)} is mapped to {_short(shard)} but is in {_short(holders[tensor])}")
    problems += [f"tensor {_short(t)} of {_short(s)} is not in the index"
                 for t, s in holders.items() if t not in shard_of]
    if problems:
        raise ShardIndexMismatch(label, problems)


def _inside(label: str, folder: str, shard: str) -> str:
    """The snapshot path of a shard the index names, or UnsafeInput when it leaves the snapshot."""
    joined = posixpath.normpath(posixpath.join(folder, shard))
    if shard.startswith(("/", "\\")) or "\\" in shard or ":" in shard.split("/")[0] \
            or joined == ".." or joined.startswith("../") or "\x00" in shard:
        raise UnsafeInput(f"{label} names shard {_short(shard)}, a path outside the snapshot",
                          hint="an index may name only files of its own snapshot: fetch the checkpoint again from "
                               "its source, or fix the index there; nothing was published")
    return joined


def _short(text: object) -> str:
    """A name from the index for an error line: quoted, escaped, and cut to a readable length."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:79] + "…"


#: config.json fields that count layers: each layer holds at least one tensor, so none exceeds the tensors stored.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
#: config.json fields that give a width: each is a dimension of some stored tensor (an embedding's rows, a
#: projection's columns), so none exceeds the largest dimension stored.
WIDTH_FIELDS = ("hidden_size", "n_embd", "d_model", "intermediate_size", "vocab_size", "num_attention_heads",
                "num_key_value_heads", "head_dim")


def check_sizes(files: Mapping[str, Path], read: Mapping[str, dict[str, Any]] | None = None) -> None:
    """The sizes each config.json gives (and its nested text or vision config) bounded by the safetensors beside it,
    before a loader builds a model from them: layers by the tensors stored, widths by the largest dimension stored.

    transformers, vLLM and the ONNX export build every layer the config names before any weight is read; a config
    of 10**9 layers beside two layers of weights would exhaust memory there. InvalidConfig names the field.
    `read`: configs already read, by label.
    """
    for label in sorted(files):
        if posixpath.basename(label) != "config.json":
            continue
        folder = posixpath.dirname(label)
        shards = [s for s in files if s.endswith(".safetensors") and posixpath.dirname(s) == folder]
        config = (read or {}).get(label) or read_object(files[label], label)
        if not shards or config is None:
            continue
        headers = [read_header(files[s], s) for s in sorted(shards)]
        tensors = sum(len(h) for h in headers)
        widest = max((d for h in headers for e in h.values() for d in e.shape), default=0)
        limits = [*((f, tensors, f"its weights hold {tensors} tensors") for f in LAYER_FIELDS),
                  *((f, widest, f"no tensor of its weights is wider than {widest}") for f in WIDTH_FIELDS)]
        for part in [config, *(v for v in config.values() if isinstance(v, dict))]:
            for field, bound, fact in limits:
                value = part.get(field)
                if isinstance(value, int) and not isinstance(value, bool) and value > bound:
                    raise InvalidConfig(label, f"gives {field} = {value}, but {fact}")
