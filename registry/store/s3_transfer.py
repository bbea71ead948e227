"""An S3 store as the other end of a transfer: a push's sink (`S3Sink`), a sync's source (`S3Source`).

Push (`registry.store.transfer.push` to an `S3Sink`): lease → upload the blobs the remote lacks
(checked by key and size, SHA-256 verified by the server; with verify_remote each present blob is
also downloaded and hashed, and sent again if it fails) → create-only manifest → key index → drop
the lease → the signature records. A push killed anywhere leaves at most unreferenced blobs; the
re-push uploads only what is missing.

Sync (`registry.store.transfer.sync` over an `S3Source`): alias record → manifest (its digest must
match the record) → with a trust policy, the version's signatures judged against it → the shared
tail. Signature records travel with push and sync (create-only, never replaced) when the version
keeps its number: a signature covers the manifest, whose bytes carry the number.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from manifests import AliasRecord, Manifest, SignatureRecord
from registry import layout
from registry.digest import sha256_file
from registry.errors import GateRefused, IntegrityError, NotFound
from registry.progress import Progress
from registry.store.bucket import PreconditionFailed
from registry.store.local import LocalStore
from registry.store.parallel import parallel
from registry.store.protocol import Version
from registry.store.s3 import S3Store
from registry.store.signatures import judge, record_bytes, record_name, signature_problems
from registry.store.transfer import Offer, PushOutcome, Trust, canary_of

MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 32 << 20


class S3Sink:
    """An S3 store as a push sends to it (`registry.store.transfer.push`): blobs checked by key and size under a lease
    on them (with verify_remote also downloaded and hashed), large ones sent in parts; the manifest written
    create-only, which numbers the version there; a version with the same conversion key already there is reused."""

    #: A re-push checks the blobs of a version already there and sends again those missing or cut short.
    repairs = True

    def __init__(self, remote: S3Store, *, workers: int = 8, verify_remote: bool = False) -> None:
        self.remote, self.checkers, self.verify_remote = remote, workers, verify_remote
        self.workers = max(1, workers // 4)  # a large blob is sent in parts, several at once

    def blobs(self, version: Version) -> dict[str, int]:
        """The version's files by sha256 (each the key of a blob)."""
        return {f.sha256: f.size for a in version.manifest.artifacts for f in a.files}

    def existing(self, version: Version) -> tuple[Version, str] | None:
        """The remote version made by the same conversion (whatever its number there)."""
        found = self.remote.find_by_key(version.name, version.manifest.key)
        return (found, found.manifest_sha256) if found is not None else None

    @contextmanager
    def sending(self, blobs: Iterable[str]) -> Iterator[None]:
        """A lease on the blobs, so that a gc of the bucket leaves them alone until the manifest names them."""
        lease = self.remote.take_lease(sorted(blobs))
        try:
            yield
        finally:
            self.remote.delete(lease)

    def sizes(self, blobs: list[str]) -> list[int | None]:
        """Each blob's size in the bucket, read in parallel."""
        return parallel(self.checkers, lambda d: self.remote.size(self.remote.blob_key(d)), blobs)

    def damaged(self, present: dict[str, int], progress: Progress) -> list[str]:
        """With verify_remote, the blobs of the right size whose bytes fail their digest (a size check cannot see
        bytes replaced by others of the same size)."""
        if not self.verify_remote:
            return []
        progress.start(f"verifying {len(present)} remote blob(s)", sum(present.values()))
        lock = threading.Lock()

        def counted(n: int) -> None:
            with lock:
                progress.advance(n)

        hashed = parallel(self.checkers, lambda d: _remote_digest(self.remote, d, counted), list(present))
        progress.done()
        return [d for d, actual in zip(present, hashed, strict=True) if actual != d]

    def send_blob(self, local: LocalStore, blob: str, advance: Callable[[int], None]) -> int:
        """Upload one blob (nothing is resumed: 0)."""
        _upload_blob(local, self.remote, blob, advance)
        return 0

    def publish(self, version: Version) -> tuple[Version, str]:
        """The manifest, create-only: the version takes the next free number there."""
        published = self.remote.publish_manifest(version.manifest)
        return published, published.manifest_sha256

    def send_signatures(self, records: list[SignatureRecord], published: Version) -> int:
        """The records the remote lacks, each create-only."""
        remote = self.remote
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
        return sent

    def outcome(self, common: PushOutcome) -> PushOutcome:
        """Whether every remote blob already there was hashed."""
        return replace(common, verified_remote=self.verify_remote)


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
