"""Garbage collection: plan (pure reading) then execute (in reverse commit order: manifest, tree, blobs).

Never removes a version an alias points to, one named by the last N history entries, or one of
the newest K versions of a model; never touches a staging tree whose writer still holds its lock;
runs only while no publisher holds the store's writer lock. A removed version's signature records
(`models/<name>/signatures/<n>/`) go with it, after its manifest (a version that is still visible
never loses its records); records left by a gc killed after that are removed by the next one, and
records of a kept version never are.

Nothing is deleted that gc has not proven to be inside the store: a symlink where mreg keeps a version, an
artifact, a blob directory or an interrupted write makes the plan (and so `gc --yes`) an IntegrityError
before anything is removed, and every removal re-checks its own path. Refusing, rather than skipping that
version, is on purpose: the store was changed by someone other than mreg, and the operator should look
before anything is deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from registry import atomic, layout
from registry.errors import Conflict, IntegrityError
from registry.store import lease
from registry.store.lease import FileSlot, local_leases
from registry.store.local import LocalStore
from registry.store.protocol import Store, first_of

if TYPE_CHECKING:
    from registry.store.s3 import S3Store


@dataclass(frozen=True)
class GCPlan:
    """What gc would remove and why the rest stays."""

    versions: tuple[tuple[str, int], ...]
    kept: tuple[tuple[str, int, str], ...]
    blobs: tuple[tuple[str, int], ...]
    staging: tuple[str, ...]
    #: Push leases (S3) and conversion leases (both) past their expiry.
    leases: tuple[str, ...] = ()
    #: Versions whose signature records are removed: those removed now, and those removed before.
    signatures: tuple[tuple[str, int], ...] = ()

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
        numbers, strays = store.survey(name)
        if strays:  # an entry gc cannot read may be what keeps a version: nothing is removed until it is looked at
            raise first_of(strays)
        aliased = {v: a for a, v in store.aliases(name).items()}
        recent: set[int] = set()
        for e in store.history(name)[-keep_history:] if keep_history > 0 else []:
            recent.add(e.to_version)
            if e.from_version is not None:
                recent.add(e.from_version)
        newest = set(numbers[-keep_latest:]) if keep_latest > 0 else set()
        for n in numbers:
            store.checked_version_dir(name, n)  # the removable ones too: their trees are what gc deletes
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
    records = sorted({*(v for v in remove if _has_records(store, *v)), *_orphan_records(store)})
    now = time.time()
    leases = [s.where for s in local_leases(store.root) if _stale_file(s.path, now)]
    return GCPlan(tuple(remove), tuple(kept), tuple(blobs), tuple(staging), tuple(leases), tuple(records))


def _stale_file(path: Path, now: float) -> bool:
    try:
        return lease.stale(path.read_bytes(), path.stat().st_mtime, now)
    except FileNotFoundError:
        return False


def _has_records(store: LocalStore, name: str, number: int) -> bool:
    return layout.signatures_dir(store.root, name, number).is_dir()


def _gone(store: LocalStore, name: str, number: int) -> bool:
    """Whether a version was removed (its directory is there without a manifest: tombstoned, or a gc was killed
    half way); a number with no directory at all was never a version here, so its records are not gc's to judge."""
    vdir = layout.version_dir(store.root, name, number)
    return vdir.is_dir() and not (vdir / layout.MANIFEST).exists()


def _orphan_records(store: LocalStore) -> list[tuple[str, int]]:
    """Signature records of versions removed earlier (by a gc that predates this rule or was killed)."""
    out = []
    for name in store.models():
        d = layout.model_dir(store.root, name) / layout.SIGNATURES
        if not d.is_dir():
            continue
        atomic.require_no_link(store.root, d, f"signatures of {name}")
        numbers = (layout.parse_version(p.name) for p in d.iterdir())  # strays: refused by the plan already
        out += [(name, n) for n in numbers if n is not None and _gone(store, name, n)]
    return out


def _stale_staging(store: LocalStore) -> list[Path]:
    if not store.tmp.is_dir():
        return []
    atomic.require_no_link(store.root, store.tmp, "interrupted writes")
    out = []
    for p in sorted(store.tmp.iterdir()):
        atomic.require_no_link(store.root, p, "interrupted write")
        if p.is_dir():
            with atomic.flock(layout.lock_beside(p), blocking=False) as got:
                if got:
                    out.append(p)
    return out


def execute_gc(store: LocalStore, plan: GCPlan) -> GCPlan:
    """Carry out a plan, re-checking every removal under the locks; returns what was removed."""
    with atomic.flock(store.root / layout.GC_LOCK, blocking=False) as got:
        if not got:
            raise _lock_holder(store)
        removed_versions = []
        for name, n in plan.versions:
            with store.alias_lock(name):
                if n in store.aliases(name).values():
                    continue
                vdir = store.checked_version_dir(name, n)  # again: the tree may have changed since the plan
                manifest = vdir / layout.MANIFEST
                if not manifest.exists():
                    continue
                manifest.unlink()  # the version is invisible from here on
                atomic.fsync_dir(vdir)
                for child in list(vdir.iterdir()):
                    if child.is_dir():
                        atomic.remove_tree(child, root=store.root)
                    else:
                        atomic.require_no_link(store.root, child, f"{name}@{n}")
                        child.unlink()
                atomic.remove_tree(layout.signatures_dir(store.root, name, n), root=store.root)
                (vdir / layout.TOMBSTONE).write_text("removed by mreg gc; the number is never reused\n")
                removed_versions.append((name, n))
        removed_records = []
        for name, n in plan.signatures:
            with store.alias_lock(name):
                if not _gone(store, name, n):  # again: only a removed version's records, never a kept one's
                    continue
                atomic.remove_tree(layout.signatures_dir(store.root, name, n), root=store.root)
                removed_records.append((name, n))
        removed_staging = []
        for s in plan.staging:
            p = Path(s)
            lock = layout.lock_beside(p)
            with atomic.flock(lock, blocking=False) as free:
                if free and p.exists():
                    atomic.remove_tree(p, root=store.root)
                    removed_staging.append(s)
            with contextlib.suppress(FileNotFoundError):
                if not p.exists():
                    lock.unlink()
        referenced: set[str] = set()
        for name in store.models():
            for n in store.versions(name):
                for art in store.version(name, n).manifest.artifacts:
                    referenced.update(f.sha256 for f in art.files)
        now = time.time()
        removed_leases = [s for s in plan.leases if FileSlot.at(Path(s)).remove_if_stale(now)]
        removed_blobs = []
        for digest, size in plan.blobs:
            if digest in referenced:
                continue
            blob = layout.blob_path(store.root, digest)
            atomic.require_no_link(store.root, blob.parent, "blobs")  # unlink(2) itself follows no link
            with contextlib.suppress(FileNotFoundError):
                os.unlink(blob)
                removed_blobs.append((digest, size))
    return GCPlan(tuple(removed_versions), plan.kept, tuple(removed_blobs), tuple(removed_staging),
                  tuple(removed_leases), signatures=tuple(removed_records))


def _lock_holder(store: LocalStore) -> Conflict:
    """Who holds the store's writer lock, from what a shared request gets: publishers hold it shared (so a shared
    request is granted beside them), another gc holds it exclusively (so it is refused)."""
    with atomic.flock(store.root / layout.GC_LOCK, shared=True, blocking=False) as shared:
        if shared:
            return Conflict("a publish is in progress in this store", hint="run gc again when it has finished")
    return Conflict("another gc is running on this store (it holds the store's gc.lock)",
                    hint="let it finish; run gc again afterwards if there is still something to remove")


def collect(store: Store, *, keep_history: int = 10, keep_latest: int = 3, grace_s: float = 24 * 3600,
            apply: bool = False) -> GCPlan:
    """Plan gc for any store and, with `apply`, carry it out; returns what was (or would be) removed.

    A local store loses unreachable versions, blobs and interrupted writes; an S3 store keeps its
    versions and loses unreferenced blobs older than `grace_s` and stale leases.
    """
    if isinstance(store, LocalStore):
        plan = plan_gc(store, keep_history=keep_history, keep_latest=keep_latest)
        return execute_gc(store, plan) if apply else plan
    from registry.store.s3 import S3Store

    assert isinstance(store, S3Store), f"no gc for {type(store).__name__}"
    return gc_remote(store, grace_s=grace_s, apply=apply)


def gc_remote(remote: S3Store, *, grace_s: float = 24 * 3600, apply: bool = False) -> GCPlan:
    """Mark from every manifest and live lease; sweep unreferenced blobs older than the grace period, and leases
    past their expiry (a conversion's blobs are protected by its push's lease while they are uploaded)."""
    from registry.store.s3 import LEASE_TTL_S

    lock_key = remote.key(*layout.s3_gc_lock())
    if apply:
        _take_gc_lock(remote, lock_key)
    try:
        now = time.time()
        referenced: set[str] = set()
        stale_leases = []
        for o in remote.list_objects(remote.key(*layout.s3_leases()) + "/"):
            obj = remote.get(o["Key"])
            if obj is None:
                continue
            at, digests = _lease_info(remote, o["Key"], obj.data)
            if now - at > LEASE_TTL_S:
                stale_leases.append(o["Key"])
            else:
                referenced.update(digests)
        for o in remote.list_objects(remote.key(*layout.s3_conversion_leases()) + "/"):
            obj = remote.get(o["Key"])
            if obj is not None and lease.stale(obj.data, o["LastModified"].timestamp(), now):
                stale_leases.append(o["Key"])
        for name in remote.models():
            for n in remote.versions(name):
                for art in remote.version(name, n).manifest.artifacts:
                    referenced.update(f.sha256 for f in art.files)
        doomed = []
        for o in remote.list_objects(remote.key(*layout.s3_blobs()) + "/"):
            digest = o["Key"].rsplit("/", 1)[-1]
            age = now - o["LastModified"].timestamp()
            if digest not in referenced and age > grace_s:
                doomed.append((digest, int(o["Size"])))
        stale_uploads = [(u["Key"], u["UploadId"]) for u in remote.multipart_uploads(remote.key(layout.BLOBS) + "/")
                         if now - u["Initiated"].timestamp() > grace_s]
        if apply:
            for digest, _ in doomed:
                remote.delete(remote.blob_key(digest))
            for key in stale_leases:
                remote.delete(key)
            for key, upload_id in stale_uploads:  # parts left by pushes that were killed mid-upload
                remote.abort_upload(key, upload_id)
    finally:
        if apply:
            remote.delete(lock_key)
    return GCPlan((), (), tuple(doomed), (), tuple(stale_leases))


def _take_gc_lock(remote: S3Store, lock_key: str) -> None:
    """Create gc.lock (create-only), with its owner and time; a lock past its expiry is a dead gc's, and is broken."""
    from registry.store.s3 import GC_LOCK_TTL_S, PreconditionFailed

    doc = json.dumps({"at": time.time(), "owner": f"{socket.gethostname()}:{os.getpid()}"}).encode()
    for _ in range(2):
        try:
            remote.put(lock_key, doc, if_none_match=True)
            return
        except PreconditionFailed:
            held = remote.get(lock_key)
            at, owner = _lock_info(held.data if held is not None else b"")
            if held is not None and time.time() - at <= GC_LOCK_TTL_S:
                since = dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")
                raise Conflict(
                    f"another gc is running on this store ({owner}, since {since})",
                    hint=f"retry when it has finished; if that gc was killed, delete s3://{remote.bucket}/{lock_key}"
                         f" (it also expires {GC_LOCK_TTL_S // 60} minutes after it was taken)") from None
            if held is not None:
                remote.delete(lock_key)  # expired, or not a lock mreg wrote: the gc that held it is gone
    raise Conflict("another gc took the lock first", hint="retry when it has finished")


def _lease_info(remote: S3Store, key: str, data: bytes) -> tuple[float, list[str]]:
    """When a push's lease was taken and the blobs it protects; one mreg did not write stops the gc (the blobs it
    would protect cannot be known, so none may be removed)."""
    try:
        doc = json.loads(data)
        at, digests = float(doc.get("at", 0)), doc.get("digests", [])
        if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
            raise TypeError("digests")
    except (ValueError, TypeError, AttributeError) as e:
        raise IntegrityError(f"{remote.url(key)} is not a lease mreg wrote ({type(e).__name__}); nothing was removed",
                             hint="delete it if no push is running, then run gc again") from None
    return at, digests


def _lock_info(data: bytes) -> tuple[float, str]:
    """When a lock was taken and by whom (0 and "unknown" for a lock that says neither)."""
    try:
        doc = json.loads(data)
        return float(doc.get("at", 0)), str(doc.get("owner", "unknown owner"))
    except (ValueError, TypeError, AttributeError):
        return 0.0, "unknown owner"
