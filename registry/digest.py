"""Hashing: sha256 for blobs, git blob sha1 for small hub files."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

CHUNK = 4 << 20
#: Bytes written between two early writebacks of a file being written.
WRITEBACK = 256 << 20


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file, read in large chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        _feed(f, (h,), on_bytes)
    return h.hexdigest()


def hashes_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file in one pass."""
    size = path.stat().st_size
    sha = hashlib.sha256()
    git = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        _feed(f, (sha, git), on_bytes)
    return sha.hexdigest(), git.hexdigest()


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file's bytes in large chunks."""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def write_hashed(dest: Path, chunks: Iterable[bytes], on_bytes: Callable[[int], None] | None = None) -> str:
    """Write chunks to a new file (never an existing one), fsync it, and return the sha256 of what was written.

    Every `WRITEBACK` bytes a thread has the kernel write out what is there so far (fdatasync), so that the
    disk works while the rest is read and hashed rather than all at the final fsync.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    h = hashlib.sha256()
    written = 0
    synced: Future[None] | None = None
    with open(dest, "xb") as f, ThreadPoolExecutor(max_workers=1, thread_name_prefix="writeback") as syncer:
        for chunk in chunks:
            h.update(chunk)
            f.write(chunk)
            before, written = written, written + len(chunk)
            if before // WRITEBACK != written // WRITEBACK and (synced is None or synced.done()):
                if synced is not None:
                    synced.result()
                synced = syncer.submit(os.fdatasync, f.fileno())
            if on_bytes is not None:
                on_bytes(len(chunk))
        f.flush()
        if synced is not None:
            synced.result()
        os.fsync(f.fileno())
    return h.hexdigest()


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the hub) gives a blob."""
    h = hashlib.sha1(f"blob {len(data)}\0".encode(), usedforsecurity=False)
    h.update(data)
    return h.hexdigest()


def _feed(f: IO[bytes], hashers: tuple[hashlib._Hash, ...], on_bytes: Callable[[int], None] | None) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):  # type: ignore[attr-defined]
        chunk = view[:n]
        for h in hashers:
            h.update(chunk)
        if on_bytes is not None:
            on_bytes(n)
