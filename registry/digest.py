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
    """Write chunks to a new file (never an existing one), fsync it, and return the sha256 of what was written
    (the disk works while the rest is read and hashed: `EarlyWriteback`)."""
    h = hashlib.sha256()
    with open(dest, "xb") as f:
        writeback = EarlyWriteback(f.fileno())
        try:
            for chunk in chunks:
                h.update(chunk)
                f.write(chunk)
                writeback.wrote(len(chunk))
                if on_bytes is not None:
                    on_bytes(len(chunk))
            f.flush()
            writeback.finish()
        finally:
            writeback.close()
        os.fsync(f.fileno())
    return h.hexdigest()


class EarlyWriteback:
    """Has the kernel write out what a file holds so far every `WRITEBACK` bytes (fdatasync in a thread of its
    own), so that the disk works while the rest is produced rather than all at the final fsync (the kernel
    starts on its own only past its dirty-memory threshold, 10% of RAM). One at a time; an I/O error surfaces
    at the next call or at `finish`, never lost."""

    def __init__(self, fd: int) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        self._fd = fd
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writeback")
        self._running: Future[None] | None = None
        self._written = 0

    def wrote(self, n: int) -> None:
        """Count `n` more bytes written; start a writeback at each `WRITEBACK` boundary when none is under way."""
        before, self._written = self._written, self._written + n
        if before // WRITEBACK != self._written // WRITEBACK and (self._running is None or self._running.done()):
            if self._running is not None:
                self._running.result()
            self._running = self._pool.submit(os.fdatasync, self._fd)

    def finish(self) -> None:
        """Wait for the writeback under way; its error is raised here."""
        if self._running is not None:
            self._running.result()

    def close(self) -> None:
        """End the thread (after the writeback under way, whose error is not raised: the caller is failing)."""
        self._pool.shutdown()


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
