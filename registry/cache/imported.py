"""Files that arrive as a stream with their sha256 already named (OCI layers): hashed while written, then linked.

The same layout as a local import: blobs named by sha256, a snapshot of links renamed into place
only when every file matched, then the record. A mismatch removes that file and raises; nothing
becomes visible.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from manifests import PullRecord, SourceFile, SourceInfo
from registry import atomic, layout, provenance
from registry.cache.plan import RemoteFile, check_space, plan_pull
from registry.cache.records import Snapshot, load_record, publish_snapshot, write_record, write_ref
from registry.digest import write_hashed
from registry.errors import IntegrityError
from registry.incoming import sized
from registry.progress import NoProgress, Progress

#: Files fetched at once.
FETCH_THREADS = 4

@dataclass(frozen=True)
class IncomingFile:
    """A file to import: its path in the snapshot, its announced size and sha256, and how to read it."""

    path: str
    size: int
    sha256: str
    chunks: Callable[[], Iterable[bytes]]


def import_files(cache: Path, repo: str, commit: str, requested: str, files: Sequence[IncomingFile], *,
                 kind: Literal["oci"], ref: str | None = None, include: Sequence[str] = (),
                 exclude: Sequence[str] = (), allow_pickle: bool = False,
                 progress: Progress | None = None) -> Snapshot:
    """Bring announced files into the cache as the snapshot `commit` of `repo`, every one verified."""
    progress = progress or NoProgress()
    hit = load_record(cache, repo, commit)
    if hit is not None:
        if ref:
            write_ref(cache, repo, ref, commit)
        return hit
    by_path = {f.path: f for f in files}
    plan = plan_pull(repo, commit, [RemoteFile(f.path, f.size, f.sha256, None) for f in files],
                     include=include, exclude=exclude, allow_pickle=allow_pickle)
    cache.mkdir(parents=True, exist_ok=True)
    blobs = layout.cache_blobs_dir(cache, repo)
    blobs.mkdir(parents=True, exist_ok=True)
    present = {f.path for f in plan.selected if (blobs / by_path[f.path].sha256).is_file()}
    plan = check_space(plan_pull(repo, commit, [RemoteFile(f.path, f.size, f.sha256, None) for f in files],
                                 include=include, exclude=exclude, allow_pickle=allow_pickle, present=present), cache)
    atomic.sweep(blobs, "tmp")
    progress.start(f"pulling {requested}", plan.missing_bytes)
    # Several layers at once (sockets, file writes and SHA-256 release the GIL), as skopeo does: one stream is
    # bound by one core's hashing and the registry's per-request latency.
    lock = threading.Lock()

    def advance(n: int) -> None:
        with lock:
            progress.advance(n)

    missing = list({by_path[rf.path].sha256: by_path[rf.path] for rf in plan.selected if rf.path not in present}
                   .values())  # one fetch per blob, however many paths it has
    with ThreadPoolExecutor(max_workers=max(1, min(FETCH_THREADS, len(missing)))) as pool:
        for _ in pool.map(lambda f: _fetch(cache, blobs, f, advance), missing):
            pass
    done = [SourceFile(path=rf.path, size=by_path[rf.path].size, sha256=by_path[rf.path].sha256, lfs=True)
            for rf in plan.selected]
    progress.done()
    snap = publish_snapshot(cache, repo, commit, done)
    record = PullRecord(source=SourceInfo(kind=kind, repo=repo, requested_revision=requested, commit=commit,
                                          files=tuple(done)),
                        skipped=plan.skipped_pickle + plan.skipped_filter, pulled=provenance.now())
    write_record(cache, repo, commit, record)
    if ref:
        write_ref(cache, repo, ref, commit)
    return Snapshot(cache, record, snap, downloaded_bytes=plan.missing_bytes)


def _fetch(cache: Path, blobs: Path, f: IncomingFile, advance: Callable[[int], None]) -> None:
    tmp = atomic.temp_name(blobs / f.sha256)
    hint = "the registry's copy is damaged: push the version again from a good store"
    try:
        # Never a byte past the declared size: the space check counted that size, and a stream that goes on is
        # refused at its first byte over it (then the temp is removed below; a kill's temp, by the next sweep).
        actual = write_hashed(tmp, sized(f.chunks(), f.size, f"{f.path}: the layer", hint), advance)
        if actual != f.sha256:
            raise IntegrityError(f"{f.path}: the bytes received hash to {actual[:12]}…, not {f.sha256[:12]}… as "
                                 "the manifest says; nothing was added to the cache", hint=hint)
        os.chmod(tmp, 0o444)
        os.replace(tmp, blobs / f.sha256)
    except OSError as e:
        atomic.raise_if_full(e, cache)
        raise
    finally:
        tmp.unlink(missing_ok=True)
