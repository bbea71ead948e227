"""An S3 store as the other end of a transfer: push a local version to it, sync an alias from it (`S3Source`).

Push: lease → upload the blobs the remote lacks (checked by key and size, SHA-256 verified by the
server; with verify_remote each present blob is also downloaded and hashed, and sent again if it
fails) → create-only manifest → key index → drop the lease. A push killed anywhere leaves at most
unreferenced blobs; the re-push uploads only what is missing.

Sync (`registry.store.transfer.sync` over an `S3Source`): alias record → manifest (its digest must
match the record) → with a trust policy, the version's signatures judged against it → the shared
tail. Signature records travel with push and sync (create-only, never replaced) when the version
keeps its number: a signature covers the manifest, whose bytes carry the number.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator

from manifests import AliasRecord, Manifest
from registry import layout
from registry.digest import sha256_file
from registry.errors import GateRefused, IntegrityError, NotFound
from registry.progress import NoProgress, Progress
from registry.store.bucket import PreconditionFailed
from registry.store.local import LocalStore
from registry.store.parallel import parallel
from registry.store.protocol import Version
from registry.store.s3 import S3Store
from registry.store.signatures import judge, record_bytes, record_name, signature_problems
from registry.store.transfer import Offer, PushOutcome, Trust, canary_of

MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 32 << 20


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
    return PushOutcome(published, published.manifest_sha256, existing is not None, len(missing),
                       sum(files[d] for d in missing), len(files) - len(missing), signatures=sent,
                       repaired_blobs=len(damaged), verified_remote=verify_remote, signatures_left=left)


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


class S3Source:
    """An alias of an S3 store, as a sync reads it: alias record → manifest (its digest must match the record) →
    the version's signature records."""

    aliases = True

    def __init__(self, remote: S3Store, name: str, alias: str, *, workers: int = 8) -> None:
        self.remote, self.name, self.alias, self.workers = remote, name, alias, workers
        self.location = remote.location
        self.repair_hint = f"re-push the version from a good copy, or run `mreg verify --store {remote.location}`"

    def head(self) -> str:
        """The alias record's ETag and, while a rollout runs, the canary alias's (a record rewritten, a step taken,
        a canary moved: another head)."""
        rec, etag = self.remote.alias_record(self.name, self.alias)
        if rec is None:
            return ""
        canary = canary_of(self.alias)
        if canary is None or not _rolling(rec):
            return etag or rec.manifest_sha256
        return f"{etag or rec.manifest_sha256} {S3Source(self.remote, self.name, canary).head()}"

    def offer(self, trust: Trust | None) -> Offer:
        """The alias's version; with a trust policy, GateRefused unless one of its signatures verifies."""
        name, alias, remote = self.name, self.alias, self.remote
        rec, _ = remote.alias_record(name, alias)
        if rec is None:
            raise NotFound(f"{name} has no alias {alias} in {remote.location}",
                           hint=f"promote a version there first: `mreg promote {name}@N --store {remote.location}`")
        manifest, raw = _aliased_manifest(remote, name, alias, rec)
        target = Version(name, rec.version, manifest, rec.manifest_sha256,
                         remote.url(remote.manifest_key(name, rec.version)))
        signatures = remote.signatures(name, rec.version)
        policy = trust(name) if trust is not None else None
        if policy is not None and not policy.empty:
            problems = signature_problems([judge(s, target, policy) for s in signatures], target, policy)
            if problems:
                raise GateRefused(f"{name} {alias} was not synced to {rec.version}: {'; '.join(problems)}",
                                  hint=f"sign {name}@{rec.version} with a trusted key and push it again; the local "
                                       f"{alias} was not changed")
        canary = canary_of(alias)
        return Offer(target, raw, rec.manifest_sha256,
                     tuple(s for s in signatures if s.manifest_sha256 == rec.manifest_sha256),
                     S3Source(remote, name, canary, workers=self.workers)
                     if canary is not None and _rolling(rec) else None)

    def open_blob(self, sha256: str) -> Iterator[bytes]:
        """A blob's bytes; IntegrityError when the server answers that it has none."""
        opened = self.remote.open(self.remote.blob_key(sha256),
                                  f"downloading blob {sha256[:12]}… from {self.remote.location}")
        if opened is None:
            raise IntegrityError(f"{self.remote.location}: blob {sha256[:12]}… named by the manifest is missing; "
                                 "nothing was published locally", hint=self.repair_hint)
        return opened[0]

    def blob_label(self, sha256: str) -> str:
        """`blob ab12…`."""
        return f"blob {sha256[:12]}…"


def _rolling(rec: AliasRecord) -> bool:
    return rec.rollout is not None and rec.rollout.state in ("running", "paused")


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
