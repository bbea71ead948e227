"""A version tree being built in the store's tmp/ directory: files placed or converted there become links to
blobs, and `LocalStore.publish` renames the whole tree into `versions/<n>`.

A staging tree sees its store only through `StagingStore`, so that this module does not import the store that
imports it (`LocalStore.stage` makes a `Staging`; `LocalStore` is checked against `StagingStore` by mypy there).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from manifests import Artifact, FileEntry
from registry import atomic, layout
from registry.digest import sha256_file
from registry.errors import IntegrityError, UsageError
from registry.progress import Progress


class StagingStore(Protocol):
    """What a staging tree needs from the local store it is built in: where it lies, and how files become blobs."""

    @property
    def root(self) -> Path:
        """The store's root directory."""

    @property
    def tmp(self) -> Path:
        """The store's directory of staging trees and their locks."""

    def link_blob(self, src: Path, sha256: str, *, verify: bool) -> Path:
        """Make `src` (on this filesystem) the blob `sha256`, or replace it by a link to the existing blob."""

    def add_blob_copy(self, src: Path, dest_in_stage: Path, expected_sha256: str | None, progress: Progress) -> str:
        """Copy `src` into the staging tree while hashing it; checks the digest when one is expected."""


def _dead_here(name: str) -> bool:
    """Whether a staging tree's name says it was made on this host by a process that no longer exists."""
    host, _, rest = name.removeprefix(layout.STAGE_PREFIX).rpartition("-")[0].rpartition("-")
    if host != socket.gethostname() or not (rest.isascii() and rest.isdigit() and len(rest) <= 9):
        return False
    try:
        os.kill(int(rest), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, and someone else's
    return False


def sweep_dead(store: StagingStore) -> list[Path]:
    """Remove the staging trees that writers killed on this host left (their process gone, their lock free), so
    that a serving node retrying a killed conversion does not fill its disk; gc removes the rest. Returns them."""
    removed: list[Path] = []
    for p in store.tmp.glob(layout.STAGE_PREFIX + "*"):
        if p.name.endswith(layout.LOCK_SUFFIX) or p.is_symlink() or not p.is_dir() or not _dead_here(p.name):
            continue
        lock = layout.lock_beside(p)
        with atomic.flock(lock, blocking=False) as free:
            if not free:
                continue
            with contextlib.suppress(FileNotFoundError):
                atomic.remove_tree(p, root=store.root)
                removed.append(p)
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    return removed


@dataclass(frozen=True)
class StagedFile:
    """A file placed in a staging tree, with its digest when already known and trusted."""

    path: str
    sha256: str | None = None


class Staging:
    """A version tree being built in the store's tmp directory; publish() makes it a version."""

    def __init__(self, store: StagingStore, name: str) -> None:
        self.store = store
        self.name = name
        store.tmp.mkdir(parents=True, exist_ok=True)
        atomic.require_no_link(store.root, store.tmp, "staging")  # a version must be built inside the store
        self.path = layout.staging_dir(store.root, socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])
        self.lock_path = layout.lock_beside(self.path)
        self._lock = contextlib.ExitStack()
        # Held for the staging tree's lifetime: gc removes only trees whose lock it can take.
        self._lock.enter_context(atomic.flock(self.lock_path))
        self.path.mkdir()
        sweep_dead(store)

    def release(self) -> None:
        """Drop the staging lock (after publish or discard)."""
        self._lock.close()
        self.lock_path.unlink(missing_ok=True)

    def discard(self) -> None:
        """Remove the staging tree and its lock."""
        atomic.remove_tree(self.path, root=self.store.root)
        self.release()

    def carry(self, art: Artifact) -> Artifact:
        """Bring another version's artifact into this tree as links to its blobs; its record is unchanged."""
        for f in art.files:
            dest = self.path / art.path / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(layout.blob_path(self.store.root, f.sha256), dest)
            except FileNotFoundError:
                raise IntegrityError(
                    f"the {art.format} artifact's {f.path} (blob {f.sha256[:12]}…) is missing from the store",
                    hint="run `mreg verify --all` to see what is damaged, and re-publish that version from its "
                         "source; nothing was published") from None
        return art

    def placer(self, fmt: str, *, copy: bool, trusted_before: float,
               progress: Progress) -> Callable[[Path, str, str], str]:
        """How source files enter an artifact tree: a hard link when possible and trusted, else a verified copy."""

        def place(src: Path, rel: str, sha256: str) -> str:
            dest = self.path / fmt / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            st = src.stat()
            if not copy and _unchanged_since(st, trusted_before, src, sha256, progress, rel):
                try:
                    os.link(src, dest)
                    return sha256
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise
            progress.start(f"copying {rel}", st.st_size)
            digest = self.store.add_blob_copy(src, dest, sha256, progress)
            progress.done()
            return digest

        return place

    def ingest(self, subdir: str, known: dict[str, str], progress: Progress,
               skip: set[str] | frozenset[str] = frozenset()) -> tuple[FileEntry, ...]:
        """Turn every file under `subdir` (but those in `skip`) into a link to its blob; return the entries."""
        root = self.path / subdir
        files = sorted(p for p in root.rglob("*")
                       if (p.is_file() or p.is_symlink()) and p.relative_to(root).as_posix() not in skip)
        entries: list[FileEntry] = []
        todo = sum(p.stat().st_size for p in files if p.relative_to(root).as_posix() not in known)
        progress.start(f"hashing {subdir}", todo)
        for p in files:
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                raise UsageError(f"converter left a symlink in the artifact: {rel}",
                                 hint="this is a bug in the converter")
            digest = known.get(rel)
            if digest is None:
                digest = sha256_file(p, progress.advance)
            self.store.link_blob(p, digest, verify=False)
            entries.append(FileEntry(path=rel, size=p.stat().st_size, sha256=digest))
        progress.done()
        return tuple(entries)


def _unchanged_since(st: os.stat_result, trusted_before: float, src: Path, sha256: str, progress: Progress,
                     rel: str) -> bool:
    """Whether a cached file still holds what the pull verified (else IntegrityError): trusted while neither its
    mtime nor its ctime moved since then, hashed again otherwise.

    ctime cannot be set back by a user (an in-place edit that restores the mtime still moves it), but a
    hard link to the file moves it too: a file linked into an earlier version is hashed once more, not copied.
    """
    if max(st.st_mtime, st.st_ctime) <= trusted_before + 1:
        return True
    progress.start(f"re-hashing {rel}", st.st_size)
    digest = sha256_file(src, progress.advance)
    progress.done()
    if digest != sha256:
        raise IntegrityError(
            f"cached file {src} changed since it was pulled: sha256 is {digest[:12]}…, "
            f"the pull recorded {sha256[:12]}…",
            hint="remove the damaged snapshot from the cache and run `mreg pull` again; nothing was published")
    return True
