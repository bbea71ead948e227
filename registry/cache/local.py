"""Importing a local model directory into the cache: copied and hashed once, then served like a hub snapshot."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from manifests import PullRecord, SourceFile, SourceInfo
from registry import atomic, layout, provenance
from registry.cache.plan import RemoteFile, check_space, plan_pull
from registry.cache.records import Snapshot, cached_ref, load_record, publish_snapshot, write_record, write_ref
from registry.digest import file_chunks, write_hashed
from registry.errors import NotFound, UnsafeInput
from registry.progress import NoProgress, Progress

#: Files imported at once (each a read, a SHA-256 and a write stream).
IMPORT_THREADS = 4


def pull_local(cache: Path, directory: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
               allow_pickle: bool = False, progress: Progress | None = None) -> Snapshot:
    """Import a local model directory into the cache (copied and hashed), as a pinned snapshot."""
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
    plan = check_space(plan, cache)
    stats = {f.path: _stat(directory / f.path) for f in plan.selected}
    previous = _unchanged_import(cache, repo, stats)
    if previous is not None:
        return previous
    blobs = layout.cache_blobs_dir(cache, repo)
    blobs.mkdir(parents=True, exist_ok=True)
    atomic.sweep(blobs, "tmp")  # what a killed import left
    atomic.sweep(layout.cache_repo_dir(cache, repo) / layout.CACHE_SNAPSHOTS, "snap")
    progress.start(f"importing {directory.name}", plan.missing_bytes)
    # Files copy and hash on several threads (hashlib and file I/O release the GIL): a sharded checkpoint
    # imports at the speed of its disks, not of one core's SHA-256.
    lock = threading.Lock()

    def advance(n: int) -> None:
        with lock:
            progress.advance(n)

    workers = max(1, min(IMPORT_THREADS, os.cpu_count() or 1, len(plan.selected)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        hashed = list(pool.map(lambda f: _import_file(cache, blobs, directory, f, advance), plan.selected))
    progress.done()
    listing = "\n".join(f"{f.sha256} {f.path}" for f in hashed).encode()
    commit = hashlib.sha1(listing, usedforsecurity=False).hexdigest()
    snap = publish_snapshot(cache, repo, commit, hashed)
    record = PullRecord(
        source=SourceInfo(kind="local", repo=repo, requested_revision=str(directory), commit=commit,
                          files=tuple(hashed)),
        skipped=plan.skipped_pickle + plan.skipped_filter,
        pulled=provenance.now(),
        local_stat=stats,
    )
    write_record(cache, repo, commit, record)
    write_ref(cache, repo, "main", commit)
    return Snapshot(cache, record, snap)

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


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns

def _unchanged_import(cache: Path, repo: str, stats: dict[str, tuple[int, int]]) -> Snapshot | None:
    """The last import of this directory, when every file still has the size and mtime it was hashed with.

    Like git's index: a file changed without changing its size within the same mtime tick would be
    missed, so files modified within two seconds of the last import are always read again.
    """
    commit = cached_ref(cache, repo, "main")
    hit = load_record(cache, repo, commit) if commit else None
    if hit is None or hit.record.local_stat != stats:
        return None
    racy = hit.record.pulled.at.timestamp() - 2
    if any(mtime_ns / 1e9 >= racy for _, mtime_ns in stats.values()):
        return None
    return hit

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"
