"""Importing a local model directory into the cache: hashed once, then served like a hub snapshot.

By default the files are not copied: the snapshot links to them in place (`PullRecord.linked`) and is
trusted only while each keeps the identity it was hashed with (size, mtime, ctime, device, inode), checked
whenever the snapshot is loaded and again before a conversion publishes. A file written in the last
`RACY_S` seconds could change again within the same timestamp tick unseen, so such an import is copied,
as is every import asked for with `copy` (a cache that keeps the bytes whatever becomes of the directory).
Hard links are never used: they would share the user's inode (its permissions, its later in-place
writes) with the cache and the store.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from manifests import PullRecord, SourceFile, SourceInfo
from registry import atomic, layout, provenance
from registry.cache.plan import RemoteFile, check_space, plan_pull
from registry.cache.records import (
    Identity,
    Snapshot,
    cached_ref,
    identity,
    load_record,
    publish_snapshot,
    write_record,
    write_ref,
)
from registry.digest import file_chunks, sha256_file, write_hashed
from registry.errors import NotFound, UnsafeInput
from registry.progress import NoProgress, Progress

#: Files imported at once (each a read, a SHA-256 and a write stream).
IMPORT_THREADS = 4
#: A file changed this recently (seconds) is copied, not linked: a second write within the same timestamp
#: tick would leave its identity unchanged (filesystems keep times as coarse as 2 s).
RACY_S = 2.0


def pull_local(cache: Path, directory: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
               allow_pickle: bool = False, copy: bool = False, progress: Progress | None = None) -> Snapshot:
    """Import a local model directory into the cache as a pinned snapshot: hashed, and linked in place (or
    copied, with `copy` or when a file is being written)."""
    import hashlib

    progress = progress or NoProgress()
    directory = directory.expanduser().resolve()  # a source given through a link is its target
    if not directory.is_dir():
        raise NotFound(f"{directory} is not a directory", hint="give the path of a model directory")
    files = _listing(directory)
    if not files:
        raise NotFound(f"{directory} holds no files", hint="give the path of a model directory")
    repo = f"local/{_slug(directory.name)}-{hashlib.sha256(str(directory).encode()).hexdigest()[:8]}"
    cache.mkdir(parents=True, exist_ok=True)
    plan = plan_pull(repo, "0" * 40, files, include=include, exclude=exclude, allow_pickle=allow_pickle)
    stats = {f.path: identity(directory / f.path) for f in plan.selected}
    previous = _unchanged_import(cache, repo, stats)
    if previous is not None and not (copy and previous.linked):
        return previous
    link = not copy and not _racy(stats, time.time())
    if not link:
        plan = check_space(plan, cache)
    blobs = layout.cache_blobs_dir(cache, repo)
    blobs.mkdir(parents=True, exist_ok=True)
    atomic.sweep(blobs, "tmp")  # what a killed import left
    atomic.sweep(layout.cache_repo_dir(cache, repo) / layout.CACHE_SNAPSHOTS, "snap")
    progress.start(f"{'hashing' if link else 'importing'} {directory.name}", plan.missing_bytes)
    # Files hash (and copy) on several threads (hashlib and file I/O release the GIL): a sharded checkpoint
    # imports at the speed of its disks, not of one core's SHA-256.
    lock = threading.Lock()

    def advance(n: int) -> None:
        with lock:
            progress.advance(n)

    def one(f: RemoteFile) -> SourceFile:
        if link:
            return SourceFile(path=f.path, size=stats[f.path][0], sha256=sha256_file(directory / f.path, advance),
                              lfs=True)
        return _import_file(cache, blobs, directory, f, advance)

    workers = max(1, min(IMPORT_THREADS, os.cpu_count() or 1, len(plan.selected)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        hashed = list(pool.map(one, plan.selected))
    progress.done()
    _refuse_moved(directory, stats)
    listing = "\n".join(f"{f.sha256} {f.path}" for f in hashed).encode()
    commit = hashlib.sha1(listing, usedforsecurity=False).hexdigest()
    kept = load_record(cache, repo, commit) if link else None
    if kept is not None and not kept.linked:
        link = False  # the same bytes are already copied in the cache: keep the copy
    else:
        publish_snapshot(cache, repo, commit, hashed, origin=directory if link else None)
    record = PullRecord(
        source=SourceInfo(kind="local", repo=repo, requested_revision=str(directory), commit=commit,
                          files=tuple(hashed)),
        skipped=plan.skipped_pickle + plan.skipped_filter,
        pulled=provenance.now(),
        local_stat=stats,
        linked=link,
    )
    write_record(cache, repo, commit, record)
    write_ref(cache, repo, "main", commit)
    return Snapshot(cache, record, layout.cache_snapshot_dir(cache, repo, commit))

def _listing(directory: Path) -> list[RemoteFile]:
    """The files of a model directory (not .git or .cache); a link that leaves it or loops, a name that is not
    UTF-8 and anything that is neither a file nor a directory (a FIFO would block the import) are refused."""
    files: list[RemoteFile] = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if rel.split("/")[0] in (".git", ".cache"):
            continue
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            raise UnsafeInput(f"{os.fsencode(rel)!r} in {directory} is not a UTF-8 file name",
                              hint="rename it: manifests, hubs and engines name files in UTF-8") from None
        if p.is_symlink():
            try:
                target = p.resolve(strict=True)
            except (OSError, RuntimeError):  # a loop (RuntimeError before Python 3.13) or a dangling link
                raise UnsafeInput(f"{rel} is a symlink that loops or leads nowhere",
                                  hint="remove the link, or replace it by the file it should name") from None
            if not target.is_relative_to(directory):  # a file's link or a directory's
                raise UnsafeInput(f"{rel} is a symlink to {target}, outside {directory}",
                                  hint="copy what it points to into the directory, or remove the link")
        if p.is_dir():
            continue
        if not p.is_file():
            raise UnsafeInput(f"{rel} in {directory} is neither a file nor a directory (a FIFO, socket or device)",
                              hint="remove it from the model directory")
        files.append(RemoteFile(rel, p.stat().st_size, None, None))
    return files


def _import_file(cache: Path, blobs: Path, directory: Path, f: RemoteFile,
                 advance: Callable[[int], None]) -> SourceFile:
    """Copy one file into the cache's blobs while hashing it; the blob is named by its sha256."""
    tmp = atomic.temp_name(blobs / "import")
    try:
        digest = write_hashed(tmp, file_chunks(directory / f.path), advance)
        os.chmod(tmp, 0o444)
        os.replace(tmp, blobs / digest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        atomic.raise_if_full(e, cache)
        raise
    size = (blobs / digest).stat().st_size
    return SourceFile(path=f.path, size=size, sha256=digest, lfs=True)


def _racy(stats: dict[str, Identity], now: float) -> bool:
    """Whether a file was written too recently for its identity to prove it unchanged later."""
    return any(max(mtime_ns, ctime_ns) / 1e9 >= now - RACY_S for _, mtime_ns, ctime_ns, _, _ in stats.values())


def _refuse_moved(directory: Path, stats: dict[str, Identity]) -> None:
    """A file written while it was read was hashed half old, half new: refuse the import."""
    for rel, before in stats.items():
        try:
            now = identity(directory / rel)
        except OSError:
            now = None
        if now != before:
            raise UnsafeInput(f"{rel} in {directory} changed while it was being read; nothing was imported",
                              hint="run the command again once nothing writes to the directory")


def _unchanged_import(cache: Path, repo: str, stats: dict[str, Identity]) -> Snapshot | None:
    """The last import of this directory, when every file still has the identity it was hashed with.

    Like git's index: a file changed without changing its size within the same timestamp tick would be
    missed, so files modified within `RACY_S` seconds of the last import are always read again.
    """
    commit = cached_ref(cache, repo, "main")
    hit = load_record(cache, repo, commit) if commit else None
    if hit is None or hit.record.local_stat != stats:
        return None
    if _racy(stats, hit.record.pulled.at.timestamp()):
        return None
    return hit

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"
