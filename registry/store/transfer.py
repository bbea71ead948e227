"""Moving versions between a local store and an S3 store: push, sync, remote verify and gc.

Push: lease → upload the blobs the remote lacks (checked by key and size, SHA-256 verified by the
server; with verify_remote each present blob is also downloaded and hashed, and sent again if it
fails) → create-only manifest → key index → drop the lease. A push killed anywhere leaves at most
unreferenced blobs; the re-push uploads only what is missing.

Sync: alias record → manifest (its digest must match the record) → with a trust policy, the
version's signatures judged against it (none valid: refused, nothing downloaded) → blobs
downloaded into a local staging tree, each hashed while written → published locally under the
same number → signature records copied → local symlink flipped. A corrupt remote blob fails the
sync before anything becomes visible.

Signature records travel with push and sync (create-only, never replaced) when the version keeps
its number: a signature covers the manifest, whose bytes carry the number.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from manifests import AliasRecord, HistoryEntry, Manifest
from registry import layout, provenance
from registry.digest import sha256_file, write_hashed
from registry.errors import Conflict, GateRefused, IntegrityError, NotFound, StoreUnreachable
from registry.incoming import sized
from registry.progress import NoProgress, Progress
from registry.store.bucket import PreconditionFailed
from registry.store.local import LocalStore
from registry.store.parallel import parallel
from registry.store.protocol import Version
from registry.store.s3 import S3Store
from registry.store.signatures import judge, record_bytes, record_name, signature_problems, write_record
from registry.store.trust import TrustPolicy

T = TypeVar("T")
MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 32 << 20


@dataclass(frozen=True)
class PushOutcome:
    """What a push did."""

    version: Version
    reused: bool
    uploaded_blobs: int
    uploaded_bytes: int
    present_blobs: int
    #: Remote blobs of the right size whose content failed its digest, uploaded again (with verify_remote).
    repaired_blobs: int = 0
    #: Whether every remote blob already there was downloaded and hashed.
    verified_remote: bool = False
    #: Signature records sent (records already there are not counted).
    signatures: int = 0
    #: Local signatures left behind: the remote version has another number, so other manifest bytes.
    signatures_left: int = 0


def push(local: LocalStore, version: Version, remote: S3Store, *, progress: Progress | None = None,
         workers: int = 8, verify_remote: bool = False) -> PushOutcome:
    """Copy a local version to the remote store; uploads only the blobs it lacks. With `verify_remote`, every
    remote blob of the right size is also downloaded and hashed, and sent again when it fails its digest (a size
    check cannot see bytes replaced by others of the same size)."""
    progress = progress or NoProgress()
    existing = remote.find_by_key(version.name, version.manifest.key)
    files = {f.sha256: f.size for a in version.manifest.artifacts for f in a.files}
    lease = remote.take_lease(sorted(files))
    try:
        # A remote blob of the wrong size (cut short, or replaced) is sent again: a re-push repairs it,
        # also when the version is already there.
        sizes = parallel(workers, lambda d: remote.size(remote.blob_key(d)), list(files))
        missing = [d for d, size in zip(files, sizes, strict=True) if size != files[d]]
        damaged: list[str] = []
        if verify_remote:
            present = [d for d in files if d not in missing]
            progress.start(f"verifying {len(present)} remote blob(s)", sum(files[d] for d in present))
            lock = threading.Lock()

            def counted(n: int) -> None:
                with lock:
                    progress.advance(n)

            hashed = parallel(workers, lambda d: _remote_digest(remote, d, counted), present)
            progress.done()
            damaged = [d for d, actual in zip(present, hashed, strict=True) if actual != d]
            missing += damaged
        progress.start(f"pushing {version.name}@{version.number}", sum(files[d] for d in missing))
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                progress.advance(n)

        parallel(max(1, workers // 4), lambda d: _upload_blob(local, remote, d, advance), missing)
        progress.done()
        published = existing or remote.publish_manifest(version.manifest)
    finally:
        remote.delete(lease)
    sent, left = _push_signatures(local, version, remote, published)
    return PushOutcome(published, existing is not None, len(missing), sum(files[d] for d in missing),
                       len(files) - len(missing), len(damaged), verify_remote, sent, left)


def _push_signatures(local: LocalStore, version: Version, remote: S3Store, published: Version) -> tuple[int, int]:
    """Send the version's signature records the remote lacks (create-only); (sent, left behind)."""
    records = local.signatures(version.name, version.number)
    if published.manifest_sha256 != version.manifest_sha256:
        return 0, len(records)
    have = set(remote.signature_keys(published.name, published.number))
    sent = 0
    for rec in records:
        key = remote.signatures_prefix(published.name, published.number) + record_name(rec)
        if key in have:
            continue
        try:
            remote.put(key, record_bytes(rec), if_none_match=True)
            sent += 1
        except PreconditionFailed:
            pass  # another push sent it first
    return sent, 0


def _remote_digest(remote: S3Store, digest: str, advance: Callable[[int], None]) -> str | None:
    """The sha256 of a remote blob's bytes as they stream in (None when it vanished meanwhile: sent again)."""
    opened = remote.open(remote.blob_key(digest), f"verifying blob {digest[:12]}… in {remote.location}")
    if opened is None:
        return None
    h = hashlib.sha256()
    for chunk in opened[0]:
        h.update(chunk)
        advance(len(chunk))
    return h.hexdigest()


def _upload_blob(local: LocalStore, remote: S3Store, digest: str, advance: Callable[[int], None]) -> None:
    path = layout.blob_path(local.root, digest)
    size = path.stat().st_size
    key = remote.blob_key(digest)
    if size < MULTIPART_THRESHOLD:
        # The blob's name is its digest: the server checks the body against it (BadDigest on a damaged file).
        remote.put(key, path.read_bytes(), sha256=digest)
        advance(size)
        return
    # A multipart upload has no whole-object check on the server: the blob is verified here before it travels.
    if sha256_file(path) != digest:
        raise IntegrityError(f"the local blob {digest[:12]}… ({path}) does not match its name",
                             hint="run `mreg verify --all` and re-publish the damaged version from its source; "
                                  "nothing was pushed")
    remote.upload_file(path, key, digest, advance, part_size=PART_SIZE, threshold=MULTIPART_THRESHOLD)


@dataclass(frozen=True)
class SyncOutcome:
    """What a sync did."""

    version: int
    changed: bool
    downloaded_blobs: int
    downloaded_bytes: int
    entry: HistoryEntry | None = None
    #: While the alias is under a staged rollout: the canary alias synced beside it.
    canary: SyncOutcome | None = None


def sync(remote: S3Store, name: str, alias: str, local: LocalStore, *, progress: Progress | None = None,
         workers: int = 8, trust: TrustPolicy | None = None) -> SyncOutcome:
    """Make the local store's `alias` point at a complete local copy of the remote alias's version; with a trust
    policy, only when one of its signatures verifies (GateRefused before anything is written otherwise)."""
    progress = progress or NoProgress()
    rec, _ = remote.alias_record(name, alias)
    if rec is None:
        raise NotFound(f"{name} has no alias {alias} in {remote.location}",
                       hint=f"promote a version there first: `mreg promote {name}@N --store {remote.location}`")
    manifest, raw = _aliased_manifest(remote, name, alias, rec)
    signatures = remote.signatures(name, rec.version)
    if trust is not None and not trust.empty:
        target = Version(name, rec.version, manifest, rec.manifest_sha256, remote.url(
            remote.manifest_key(name, rec.version)))
        problems = signature_problems([judge(s, target, trust) for s in signatures], target, trust)
        if problems:
            raise GateRefused(f"{name} {alias} was not synced to {rec.version}: {'; '.join(problems)}",
                              hint=f"sign {name}@{rec.version} with a trusted key and push it again; the local "
                                   f"{alias} was not changed")
    downloaded = (0, 0)
    have = _local_version(local, name, rec.version)
    if have is None:
        downloaded = _materialize(remote, local, manifest, raw, progress, workers)
    elif have != rec.manifest_sha256:
        raise Conflict(f"the local store already has a different {name}@{rec.version}",
                       hint="sync into a store used only for syncing from this remote")
    for sig in signatures:
        if sig.manifest_sha256 == rec.manifest_sha256:
            write_record(local, sig)
    _, entry = local_flip(local, name, alias, rec.version)
    return SyncOutcome(rec.version, entry is not None, downloaded[0], downloaded[1], entry,
                       _sync_canary(remote, name, alias, local, rec, progress, workers, trust))


def _sync_canary(remote: S3Store, name: str, alias: str, local: LocalStore, rec: AliasRecord, progress: Progress,
                 workers: int, trust: TrustPolicy | None) -> SyncOutcome | None:
    """While the alias is under a rollout, the serving node holds the canary version too (its own alias); once the
    rollout is over, the local canary alias goes."""
    canary = layout.canary_alias(alias)
    if len(canary) > 64 or alias.endswith(layout.CANARY_SUFFIX):
        return None
    if rec.rollout is not None and rec.rollout.state in ("running", "paused"):
        try:
            return sync(remote, name, canary, local, progress=progress, workers=workers, trust=trust)
        except NotFound:
            return None  # the canary alias is written just after the rollout's start commits
    if local.alias(name, canary) is not None:
        local.drop_alias(name, canary)
    return None


def _aliased_manifest(remote: S3Store, name: str, alias: str, rec: AliasRecord) -> tuple[Manifest, bytes]:
    """The manifest an alias record points to and its bytes, checked against the record and its own key.

    Everything local is written from it (the model's directory, the number, the alias), so it is checked
    before anything is.
    """
    obj = remote.get(remote.manifest_key(name, rec.version))
    if obj is None:
        raise remote.missing_target(name, alias, rec.version)
    if hashlib.sha256(obj.data).hexdigest() != rec.manifest_sha256:
        raise IntegrityError(f"{remote.url(remote.manifest_key(name, rec.version))} does not match the digest in "
                             f"its alias record {remote.url(remote.alias_key(name, alias))}",
                             hint=f"run `mreg verify {name}@{rec.version} --store {remote.location}`")
    return remote.checked_manifest(name, rec.version, obj.data), obj.data


def _local_version(local: LocalStore, name: str, number: int) -> str | None:
    try:
        return local.version(name, number).manifest_sha256
    except NotFound:
        return None


def _materialize(remote: S3Store, local: LocalStore, manifest: Manifest, raw: bytes, progress: Progress,
                 workers: int) -> tuple[int, int]:
    """Download what the local store lacks into a staging tree, verify, publish under the remote number."""
    with local.writers():
        staging = local.stage(manifest.name)
        try:
            wanted: dict[str, list[Path]] = {}
            for art in manifest.artifacts:
                for f in art.files:
                    wanted.setdefault(f.sha256, []).append(staging.path / art.path / f.path)
            sizes = {f.sha256: f.size for a in manifest.artifacts for f in a.files}
            missing = [d for d in wanted if not layout.blob_path(local.root, d).exists()]
            progress.start(f"syncing {manifest.name}@{manifest.version}", sum(sizes[d] for d in missing))
            lock = threading.Lock()

            def fetch(d: str) -> None:
                first = wanted[d][0]
                first.parent.mkdir(parents=True, exist_ok=True)
                _download_verified(remote, d, sizes[d], first, progress, lock)

            parallel(workers, fetch, missing)
            progress.done()
            local.place_blobs(wanted)
            local.publish_exact(staging, raw, manifest.version)
        except BaseException:
            staging.discard()
            raise
    return len(missing), sum(sizes[d] for d in missing)


def _download_verified(remote: S3Store, digest: str, size: int, dest: Path, progress: Progress,
                       lock: threading.Lock) -> None:
    opened = remote.open(remote.blob_key(digest), f"downloading blob {digest[:12]}… from {remote.location}")
    if opened is None:  # the server answered: the manifest names a blob the store does not hold
        raise IntegrityError(
            f"{remote.location}: blob {digest[:12]}… named by the manifest is missing; nothing was published locally",
            hint=f"re-push the version from a good copy, or run `mreg verify --store {remote.location}`",
        )

    def advance(n: int) -> None:
        with lock:
            progress.advance(n)

    hint = f"re-push the version from a good copy, or run `mreg verify --store {remote.location}`"
    body = sized(opened[0], size, f"{remote.location}: blob {digest[:12]}…", hint)  # never a byte past its size
    actual = write_hashed(dest, body, advance)  # a dropped connection: one-line error, staging discarded
    if actual != digest:
        raise IntegrityError(
            f"{remote.location}: blob {digest[:12]}… is corrupt (its content hashes to {actual[:12]}…); "
            "nothing was published locally",
            hint=f"re-push the version from a good copy, or run `mreg verify --store {remote.location}`",
        )


def local_flip(local: LocalStore, name: str, alias: str, number: int) -> tuple[int | None, HistoryEntry | None]:
    """Point a local alias at a version, recording a `sync` entry."""

    def decide(current: int | None, _h: object) -> HistoryEntry | None:
        if current == number:
            return None
        return HistoryEntry.model_validate({"alias": alias, "action": "sync", "from": current, "to": number,
                                            "reason": "followed the remote alias", "by": provenance.now()})

    return local.transact_alias(name, alias, decide)


def watch(remote: S3Store, name: str, alias: str, local: LocalStore, every: float,
          on_change: Callable[[SyncOutcome], None], stop: threading.Event,
          on_error: Callable[[Exception], None], trust: TrustPolicy | None = None) -> None:
    """Follow a remote alias until `stop` is set; each change is synced and reported. A round whose alias records
    are as the last synced round left them, with the local alias still where it put it, reads nothing more: no
    manifest, no signature verified again, no blob."""
    synced: tuple[str, int] | None = None
    while not stop.is_set():
        try:
            now = head(remote, name, alias)
            if synced is None or synced != (now, local.alias(name, alias)):
                out = sync(remote, name, alias, local, trust=trust)
                synced = (now, out.version)
                if out.changed:
                    on_change(out)
        # Reported; the next round retries (a refused version may be signed meanwhile).
        except (IntegrityError, NotFound, Conflict, StoreUnreachable, GateRefused) as e:
            on_error(e)
        stop.wait(every)


def head(remote: S3Store, name: str, alias: str) -> str:
    """What a sync of the alias depends on, read cheaply: its record's ETag and, while a rollout runs, the canary
    alias's (a record rewritten, a step taken, a canary moved: another head)."""
    rec, etag = remote.alias_record(name, alias)
    if rec is None:
        return ""
    canary = layout.canary_alias(alias)
    if rec.rollout is None or rec.rollout.state not in ("running", "paused") or len(canary) > 64 \
            or alias.endswith(layout.CANARY_SUFFIX):
        return etag or rec.manifest_sha256
    return f"{etag or rec.manifest_sha256} {head(remote, name, canary)}"
