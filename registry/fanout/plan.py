"""Planning a matrix: each item's conversion key, what it needs, and whether the store already has its version.

The key is the one `mreg convert` computes (registry.convert.plan.conversion_key): the source's
commit and every file's sha256, each target's converter, options and tool versions. It is known
without the weights: a directory is hashed where it is (as a convert imports it), and a hub
repository's weights are listed with their sha256 while its small files are pulled and hashed
(registry.cache.describe_hub). An item built on a GPU it is not planned on (TensorRT on a GPU
product, or on "the local GPU") has its key computed there: the engine's compute capability is an
input, and the planner has no such GPU; those items show `key: null` and are always scheduled.
Tool versions are the planning machine's, so plan in the image the runners use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from manifests import SourceInfo
from registry.cache import describe_hub, local_source, pull
from registry.convert.plan import conversion_key, prepare, with_prerequisites
from registry.errors import MregError, UsageError
from registry.fanout.matrix import Item, Matrix
from registry.store.protocol import Store

KEY_ON_GPU = "computed on the GPU it is built on: the engine's compute capability is an input"


@dataclass(frozen=True)
class PlannedItem:
    """An item with its key and, where the key is known, the version the store has for it."""

    item: Item
    key: str | None
    key_note: str | None
    commit: str | None
    #: The existing version's number; None when there is none, or the key is not known here.
    version: int | None

    @property
    def exists(self) -> bool | None:
        """Whether the store has it; None when that cannot be known before the item runs."""
        return None if self.key is None else self.version is not None


def check_items(matrix: Matrix) -> None:
    """Refuse bad formats and options in every item that is planned here, naming its place in the file."""
    for item in matrix.items:
        if item.need.kind == "gpu":
            continue  # its options are completed by the GPU it runs on (the local compute capability)
        try:
            prepare([item.target])
        except MregError as e:
            raise UsageError(f"{matrix.path}: {item.where} {item.target!r}: {e}", hint=e.hint or "") from None


def plan(matrix: Matrix, store: Store, cache: Path, *, offline: bool = False,
         endpoint: str | None = None) -> list[PlannedItem]:
    """Every item with its key and existing version (sources described once each, weights never downloaded)."""
    check_items(matrix)
    sources: dict[str, SourceInfo] = {}
    out = []
    for item in matrix.items:
        if item.source not in sources:
            sources[item.source] = describe(item.source, cache, offline=offline, endpoint=endpoint)
        source = sources[item.source]
        if item.need.kind == "gpu":
            out.append(PlannedItem(item, None, KEY_ON_GPU, source.commit, None))
            continue
        key = item_key(source, item.target)
        found = store.find_by_key(item.name, key) if store.has_model(item.name) else None
        out.append(PlannedItem(item, key, None, source.commit, found.number if found else None))
    return out


def describe(source: str, cache: Path, *, offline: bool, endpoint: str | None) -> SourceInfo:
    """The source record a convert of `source` works from: a directory imported (hashed once, linked in place),
    a hub repository described without its weights."""
    if local_source(source) is not None:
        return pull(cache, source).record.source
    repo, _, rev = source.partition("@")
    return describe_hub(cache, repo, rev or None, endpoint=endpoint, offline=offline)


def item_key(source: SourceInfo, target: str) -> str:
    """The key `mreg convert SOURCE --to TARGET` computes for a new version (no parent)."""
    planned = with_prerequisites(prepare([target]), set())
    return conversion_key(source, [(c.format, c.name, c.version, p.options, tools) for c, p, tools in planned])


def missing(planned: Sequence[PlannedItem]) -> list[PlannedItem]:
    """The items a run must schedule: not in the store, or not knowable before they run."""
    return [p for p in planned if not p.exists]
