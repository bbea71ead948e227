"""One transfer core: a version pushed from the local store to a sink (an S3 store, an OCI target), and a
version synced from a source (an S3 store's alias, an OCI artifact) into the local store.

Push: the blobs that make the version at the sink → the version already there (reused: not published
again; S3 still checks its blobs, and a tag naming another digest is a Conflict for OCI unless forced)
→ the blobs the sink lacks, by size (S3 with verify_remote: also those whose bytes fail their digest)
→ each sent → the manifest published last → the signature records the sink lacks, when the version
there has the local manifest's bytes (a signature covers them). A killed push leaves at most blobs
no manifest names; the next one sends only what is missing.

Sync: the source's offer (its manifest checked against where it was read from; with a trust policy,
the version's signatures judged against it: none valid, refused, nothing downloaded) → have it
already (the same manifest digest), or another version under that number (Conflict), or the blobs
the local store lacks downloaded into a staging tree, each hashed while written → published
locally under the same number → signature records kept → local symlink flipped; under a rollout,
the canary alias beside it. A corrupt blob fails the sync before anything becomes visible.

Watch: a sync every round, except when the source's head (what it names, read cheaply) and the
local alias are as the last synced round left them: then nothing else is read.

The sinks are `registry.store.s3_transfer.S3Sink` and `registry.oci.transfer.OciSink`, the sources
`registry.store.s3_transfer.S3Source` and `registry.oci.transfer.OciSource`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from manifests import HistoryEntry, Manifest, SignatureRecord
from registry import layout, provenance
from registry.digest import write_hashed
from registry.errors import Conflict, GateRefused, IntegrityError, NotFound, StoreUnreachable
from registry.incoming import sized
from registry.progress import NoProgress, Progress
from registry.store.local import LocalStore
from registry.store.parallel import parallel
from registry.store.protocol import Version
from registry.store.signatures import write_record
from registry.store.trust import TrustPolicy


@dataclass(frozen=True)
class PushOutcome:
    """What a push did, to S3 or to OCI."""

    #: The version pushed (to S3: as the remote numbered it).
    version: Version
    #: What names it there: its manifest's sha256 (S3), its OCI manifest's digest (OCI).
    digest: str
    reused: bool
    uploaded_blobs: int
    uploaded_bytes: int
    present_blobs: int
    #: Signature records sent (records already there are not counted).
    signatures: int = 0
    #: S3: remote blobs of the right size whose content failed its digest, uploaded again (with verify_remote).
    repaired_blobs: int = 0
    #: S3: whether every remote blob already there was downloaded and hashed.
    verified_remote: bool = False
    #: S3: local signatures left behind: the remote version has another number, so other manifest bytes.
    signatures_left: int = 0
    #: OCI: the tag the manifest was put under, and the digest it named before when the push moved it.
    tag: str | None = None
    replaced: str | None = None
    #: OCI: bytes of `uploaded_bytes`' blobs not sent again: the registry had them from an interrupted upload.
    resumed_bytes: int = 0


class Sink(Protocol):
    """Where a push sends a version (an S3 store, an OCI target): the blobs that make it there, what is there
    already, each missing blob sent, the manifest published, the signature records sent."""

    #: How many blobs may be sent at once.
    workers: int
    #: Whether the blobs of a version already there are still checked, and those missing sent (S3: a re-push repairs
    #: a damaged bucket; OCI: the tag names the same digest, so the artifact is whole).
    repairs: bool

    def blobs(self, version: Version) -> dict[str, int]:
        """The blobs that make the version at the sink, by the name the sink gives each, with their sizes."""

    def existing(self, version: Version) -> tuple[Version, str] | None:
        """The version already there (reused, not published again) and what names it, or None; a Conflict when the
        place it would take holds another (OCI: a tag naming another digest, unless forced)."""

    def sending(self, blobs: Iterable[str]) -> AbstractContextManager[object]:
        """Held while blobs are checked and sent and the manifest published (S3: a lease on the blobs; OCI: the
        upload sessions kept from gc)."""

    def sizes(self, blobs: list[str]) -> list[int | None]:
        """The size of each blob at the sink (None: it has none)."""

    def damaged(self, present: dict[str, int], progress: Progress) -> list[str]:
        """Of the blobs there with the right size, those whose bytes fail their digest (S3 with verify_remote: each
        downloaded and hashed; otherwise none)."""

    def send_blob(self, local: LocalStore, blob: str, advance: Callable[[int], None]) -> int:
        """Send one blob from the local store; returns the bytes the sink already had from an interrupted upload."""

    def publish(self, version: Version) -> tuple[Version, str]:
        """Publish the manifest, after every blob: the version as numbered there, and what names it."""

    def send_signatures(self, records: list[SignatureRecord], published: Version) -> int:
        """Send the signature records the sink lacks; returns how many were sent."""

    def outcome(self, common: PushOutcome) -> PushOutcome:
        """The outcome the core built, with what only this sink tells (S3: verified_remote; OCI: the tag, the digest
        it named before)."""


def push(sink: Sink, local: LocalStore, version: Version, *, progress: Progress | None = None) -> PushOutcome:
    """Copy a local version to a sink: what is there already is reused, only the blobs it lacks are sent, the
    manifest is published last, then the signature records it lacks."""
    progress = progress or NoProgress()
    blobs = sink.blobs(version)
    there = sink.existing(version)
    missing: list[str] = []
    damaged: list[str] = []
    resumed = 0
    if there is None or sink.repairs:
        with sink.sending(blobs):
            # A blob of the wrong size (cut short, or replaced) is sent again.
            sizes = sink.sizes(list(blobs))
            missing = [b for b, size in zip(blobs, sizes, strict=True) if size != blobs[b]]
            absent = set(missing)
            damaged = sink.damaged({b: n for b, n in blobs.items() if b not in absent}, progress)
            missing += damaged
            progress.start(f"pushing {version.name}@{version.number}", sum(blobs[b] for b in missing))
            lock = threading.Lock()

            def advance(n: int) -> None:
                with lock:
                    progress.advance(n)

            resumed = sum(parallel(sink.workers, lambda b: sink.send_blob(local, b, advance), missing))
            progress.done()
            published = there or sink.publish(version)
    else:
        published = there
    remote, digest = published
    records = local.signatures(version.name, version.number)
    # A signature covers the manifest's bytes, which carry the number: a version numbered otherwise there keeps none.
    same = remote.manifest_sha256 == version.manifest_sha256
    sent = sink.send_signatures(records, remote) if same else 0
    return sink.outcome(PushOutcome(remote, digest, there is not None, len(missing),
                                    sum(blobs[b] for b in missing) - resumed, len(blobs) - len(missing),
                                    signatures=sent, repaired_blobs=len(damaged),
                                    signatures_left=0 if same else len(records), resumed_bytes=resumed))


#: The trust policy of a model, by its name (a sync from OCI learns the name from the artifact).
Trust = Callable[[str], TrustPolicy]


class Source(Protocol):
    """Where a sync reads a version from (an S3 store's alias, an OCI artifact): what it names now, read cheaply;
    the version with its manifest checked and the signature records to keep; the version's blobs."""

    location: str
    #: Whether what the source names is an alias, which a staged rollout can be under (its canary synced beside it).
    aliases: bool
    #: How many blobs may be downloaded at once.
    workers: int
    #: What to do about a blob the source lacks or serves corrupt.
    repair_hint: str

    def head(self) -> str:
        """What the source names now ("" when nothing), read without the manifest: the same head, the same sync."""

    def offer(self, trust: Trust | None) -> Offer:
        """The version the source names, its manifest checked against where it was read from before anything local
        is written from it, and the signature records to keep beside it (under a trust policy that is not empty:
        GateRefused, before any blob is fetched, unless one of them verifies)."""

    def open_blob(self, sha256: str) -> Iterator[bytes]:
        """A blob's bytes as they arrive (the caller hashes them); an MregError when the source lacks it."""

    def blob_label(self, sha256: str) -> str:
        """How an error names a blob of this source."""


@dataclass(frozen=True)
class Offer:
    """A version as a source offers it, checked, before anything local is written."""

    version: Version
    #: The manifest's exact bytes (published locally as they are: a signature covers them).
    raw: bytes
    #: What names the version at the source (an alias record's manifest sha256, an OCI manifest digest).
    digest: str
    signatures: tuple[SignatureRecord, ...]
    #: While the alias is under a staged rollout: the source of its canary alias.
    canary: Source | None = None


@dataclass(frozen=True)
class SyncOutcome:
    """What a sync did."""

    name: str
    version: int
    #: What names the version at the source (see `Offer.digest`).
    digest: str
    changed: bool
    downloaded_blobs: int
    downloaded_bytes: int
    entry: HistoryEntry | None = None
    #: Signature records kept beside the local version.
    signatures: int = 0
    #: While the alias is under a staged rollout: the canary alias synced beside it.
    canary: SyncOutcome | None = None


def sync(source: Source, local: LocalStore, alias: str, *, progress: Progress | None = None,
         trust: Trust | None = None) -> SyncOutcome:
    """Make the local store's `alias` point at a complete local copy of the version the source names: have it
    already, or download what is missing and publish it under the same number; keep its signature records; flip.
    With a trust policy, only a version one of whose signatures verifies (GateRefused before anything is written
    otherwise)."""
    progress = progress or NoProgress()
    offer = source.offer(trust)
    v = offer.version
    downloaded = (0, 0)
    have = _local_version(local, v.name, v.number)
    if have is None:
        downloaded = _materialize(source, local, v.manifest, offer.raw, progress)
    elif have != v.manifest_sha256:
        raise Conflict(f"the local store already has a different {v.name}@{v.number}",
                       hint=f"sync into a store used only for syncing from {source.location}")
    for rec in offer.signatures:
        write_record(local, rec)
    _, entry = local_flip(local, v.name, alias, v.number)
    return SyncOutcome(v.name, v.number, offer.digest, entry is not None, *downloaded, entry=entry,
                       signatures=len(offer.signatures),
                       canary=_sync_canary(source, offer, local, alias, progress, trust))


def _sync_canary(source: Source, offer: Offer, local: LocalStore, alias: str, progress: Progress,
                 trust: Trust | None) -> SyncOutcome | None:
    """While the alias is under a rollout, the serving node holds the canary version too (its own alias); once the
    rollout is over, the local canary alias goes."""
    canary = canary_of(alias)
    if not source.aliases or canary is None:
        return None
    if offer.canary is not None:
        try:
            return sync(offer.canary, local, canary, progress=progress, trust=trust)
        except NotFound:
            return None  # the canary alias is written just after the rollout's start commits
    if local.alias(offer.version.name, canary) is not None:
        local.drop_alias(offer.version.name, canary)
    return None


def _local_version(local: LocalStore, name: str, number: int) -> str | None:
    try:
        return local.version(name, number).manifest_sha256
    except NotFound:
        return None


def _materialize(source: Source, local: LocalStore, manifest: Manifest, raw: bytes,
                 progress: Progress) -> tuple[int, int]:
    """Download what the local store lacks into a staging tree, verify, publish under the source's number."""
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
                _download_verified(source, d, sizes[d], first, progress, lock)

            parallel(source.workers, fetch, missing)
            progress.done()
            local.place_blobs(wanted)
            local.publish_exact(staging, raw, manifest.version)
        except BaseException:
            staging.discard()
            raise
    return len(missing), sum(sizes[d] for d in missing)


def _download_verified(source: Source, digest: str, size: int, dest: Path, progress: Progress,
                       lock: threading.Lock) -> None:
    def advance(n: int) -> None:
        with lock:
            progress.advance(n)

    label = f"{source.location}: {source.blob_label(digest)}"
    body = sized(source.open_blob(digest), size, label, source.repair_hint)  # never a byte past its size
    actual = write_hashed(dest, body, advance)  # a dropped connection: one-line error, staging discarded
    if actual != digest:
        raise IntegrityError(f"{label} is corrupt (its content hashes to {actual[:12]}…); nothing was published "
                             "locally", hint=source.repair_hint)


def local_flip(local: LocalStore, name: str, alias: str, number: int) -> tuple[int | None, HistoryEntry | None]:
    """Point a local alias at a version, recording a `sync` entry."""

    def decide(current: int | None, _h: object) -> HistoryEntry | None:
        if current == number:
            return None
        return HistoryEntry.model_validate({"alias": alias, "action": "sync", "from": current, "to": number,
                                            "reason": "followed the remote alias", "by": provenance.now()})

    return local.transact_alias(name, alias, decide)


def watch(source: Source, local: LocalStore, alias: str, every: float, on_change: Callable[[SyncOutcome], None],
          stop: threading.Event, on_error: Callable[[Exception], None], trust: Trust | None = None) -> None:
    """Follow a source until `stop` is set; each change is synced and reported. A round whose source has the head
    the last synced round read, with the local alias still where that round put it, reads nothing more: no
    manifest, no signature verified again, no blob."""
    synced: tuple[str, SyncOutcome] | None = None
    while not stop.is_set():
        try:
            now = source.head()
            if synced is None or synced[0] != now or local.alias(synced[1].name, alias) != synced[1].version:
                out = sync(source, local, alias, trust=trust)
                synced = (now, out)
                if out.changed:
                    on_change(out)
        # Reported; the next round retries (a refused version may be signed meanwhile).
        except (IntegrityError, NotFound, Conflict, StoreUnreachable, GateRefused) as e:
            on_error(e)
        stop.wait(every)


def canary_of(alias: str) -> str | None:
    """The canary alias synced beside `alias` under a rollout (None for a canary itself, or a name too long)."""
    canary = layout.canary_alias(alias)
    return None if len(canary) > 64 or alias.endswith(layout.CANARY_SUFFIX) else canary
