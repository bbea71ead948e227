"""Shard indexes (`*.safetensors.index.json`), read as hostile input: an index must agree exactly with its shards.

An engine (transformers, vLLM, TGI) opens the shards an index names and looks each tensor up in
the shard it is mapped to. So an index is refused when it names a path that leaves the snapshot
(absolute, or climbing out with `..`: `UnsafeInput`, exit 8, as a symlink out of a source is), or
when it disagrees with the shards' headers (`ShardIndexMismatch`, exit 4): a shard the snapshot
lacks, a tensor no shard holds, a tensor of a shard that the index leaves out or maps elsewhere,
or a tensor held by two of its shards. Paths are relative to the index's own directory, as
transformers joins them (a diffusers pipeline keeps one index per component folder).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path

from registry.convert.configs import InvalidConfig, read_object
from registry.convert.safetensors import read_header
from registry.errors import IntegrityError, UnsafeInput

INDEX_SUFFIX = ".safetensors.index.json"
#: Problems named in one error line (the rest are counted).
_SHOWN = 3


class ShardIndexMismatch(IntegrityError):
    """A shard index that does not describe the shards beside it."""

    def __init__(self, label: str, problems: list[str]) -> None:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        super().__init__(f"{label} disagrees with its shards: {'; '.join(problems[:_SHOWN])}{more}",
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
        if shard not in files:
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
