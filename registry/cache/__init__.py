"""The cache: hub snapshots pinned to a commit, in huggingface_hub's own layout, verified by mreg.

`pull` = plan (`plan`: what to fetch, is it safe, does it fit) then execute (`hub`: download
with huggingface_hub and verify every file; `local`: import a directory), and keep the record
(`records`). Its root is explicit: `--cache-dir`, `MREG_CACHE_DIR` or the config file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from registry.cache.hub import describe_hub, pull_hub
from registry.cache.local import pull_local
from registry.cache.records import Snapshot, load_record
from registry.progress import Progress

__all__ = ["Snapshot", "describe_hub", "load_record", "local_source", "pull", "pull_hub", "pull_local"]

def pull(cache: Path, source: str, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
         allow_pickle: bool = False, offline: bool = False, endpoint: str | None = None, copy: bool = False,
         progress: Progress | None = None) -> Snapshot:
    """Pull `ORG/NAME[@REV]`, `./DIR` or `file:///DIR` into the cache (a local directory ignores the hub options;
    it is linked in place unless `copy`)."""
    local = local_source(source)
    if local is not None:
        return pull_local(cache, local, include=include, exclude=exclude, allow_pickle=allow_pickle, copy=copy,
                          progress=progress)
    repo, _, rev = source.partition("@")
    return pull_hub(cache, repo, rev or None, endpoint=endpoint, include=include, exclude=exclude,
                    allow_pickle=allow_pickle, offline=offline, progress=progress)

def local_source(source: str) -> Path | None:
    """The directory a source names when it is a local one (`./dir`, `/abs`, `~/x`, `file://…`)."""
    if source.startswith("file://"):
        return Path(source[len("file://"):])
    if source.startswith(("/", "./", "../", "~")) or source in (".", "..") or os.path.isdir(source):
        return Path(source)
    return None
