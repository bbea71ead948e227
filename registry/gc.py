"""Garbage collection: plan (pure reading) then execute (in reverse commit order: manifest, tree, blobs).

Never removes a version an alias points to, one named by the last N history entries, or one of
the newest K versions of a model; never touches a staging tree whose writer still holds its lock;
runs only while no publisher holds the store's writer lock.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from registry import atomic, layout
from registry.errors import Conflict
from registry.store import LocalStore, _rmtree


@dataclass(frozen=True)
class GCPlan:
    """What gc would remove and why the rest stays."""

    versions: tuple[tuple[str, int], ...]
    kept: tuple[tuple[str, int, str], ...]
    blobs: tuple[tuple[str, int], ...]
    staging: tuple[str, ...]

    @property
    def blob_bytes(self) -> int:
        """Bytes the blob removals free."""
        return sum(size for _, size in self.blobs)


def plan_gc(store: LocalStore, *, keep_history: int = 10, keep_latest: int = 3) -> GCPlan:
    """Work out what is unreachable, without changing anything."""
    remove: list[tuple[str, int]] = []
    kept: list[tuple[str, int, str]] = []
    referenced: set[str] = set()
    for name in store.models():
        numbers = store.versions(name)
        aliased = {v: a for a, v in store.aliases(name).items()}
        recent: set[int] = set()
        for e in store.history(name)[-keep_history:] if keep_history > 0 else []:
            recent.add(e.to_version)
            if e.from_version is not None:
                recent.add(e.from_version)
        newest = set(numbers[-keep_latest:]) if keep_latest > 0 else set()
        for n in numbers:
            if n in aliased:
                why = f"alias {aliased[n]}"
            elif n in recent:
                why = f"in the last {keep_history} history entries"
            elif n in newest:
                why = f"one of the newest {keep_latest}"
            else:
                remove.append((name, n))
                continue
            kept.append((name, n, why))
            for art in store.version(name, n).manifest.artifacts:
                referenced.update(f.sha256 for f in art.files)
    blobs = [(d, p.stat().st_size) for d, p in store.blob_digests() if d not in referenced]
    staging = [str(p) for p in _stale_staging(store)]
    return GCPlan(tuple(remove), tuple(kept), tuple(blobs), tuple(staging))


def _stale_staging(store: LocalStore) -> list[Path]:
    if not store.tmp.is_dir():
        return []
    out = []
    for p in sorted(store.tmp.iterdir()):
        if p.is_dir():
            with atomic.flock(store.tmp / (p.name + ".lock"), blocking=False) as got:
                if got:
                    out.append(p)
    return out


def execute_gc(store: LocalStore, plan: GCPlan) -> GCPlan:
    """Carry out a plan, re-checking every removal under the locks; returns what was removed."""
    with atomic.flock(store.root / layout.GC_LOCK, blocking=False) as got:
        if not got:
            raise Conflict("a publish is in progress in this store", hint="run gc again when it has finished")
        removed_versions = []
        for name, n in plan.versions:
            with store.alias_lock(name):
                if n in store.aliases(name).values():
                    continue
                vdir = layout.version_dir(store.root, name, n)
                manifest = vdir / layout.MANIFEST
                if not manifest.exists():
                    continue
                manifest.unlink()  # the version is invisible from here on
                atomic.fsync_dir(vdir)
                for child in list(vdir.iterdir()):
                    if child.is_dir() and not child.is_symlink():
                        _rmtree(child)
                    else:
                        child.unlink()
                (vdir / layout.TOMBSTONE).write_text("removed by mreg gc; the number is never reused\n")
                removed_versions.append((name, n))
        removed_staging = []
        for s in plan.staging:
            p = Path(s)
            lock = store.tmp / (p.name + ".lock")
            with atomic.flock(lock, blocking=False) as free:
                if free and p.exists():
                    _rmtree(p)
                    removed_staging.append(s)
            with contextlib.suppress(FileNotFoundError):
                if not p.exists():
                    lock.unlink()
        referenced: set[str] = set()
        for name in store.models():
            for n in store.versions(name):
                for art in store.version(name, n).manifest.artifacts:
                    referenced.update(f.sha256 for f in art.files)
        removed_blobs = []
        for digest, size in plan.blobs:
            if digest in referenced:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layout.blob_path(store.root, digest))
                removed_blobs.append((digest, size))
    return GCPlan(tuple(removed_versions), plan.kept, tuple(removed_blobs), tuple(removed_staging))
