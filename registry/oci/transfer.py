"""An OCI target as the other end of a transfer: a push's sink (`OciSink`), a sync's source (`OciSource`); and
pull an artifact into the cache.

Push (`registry.store.transfer.push` to an `OciSink`): pack (pure) → the tag's current manifest (a
different digest refused unless forced) → HEAD every blob, upload only the missing ones (streamed;
chunked when large) → PUT the manifest → the version's signature records, each a referrer of that
manifest (`signatures`), those not listed yet. A killed push leaves only blobs no manifest names
(or a model with fewer signatures); the next push sends what is missing.

Pull and sync: the manifest (its digest checked against the reference when it is one) → (sync) its
signature referrers, judged against the trust policy of the model the mreg manifest layer names,
before any other layer is fetched → every layer streamed, hashed while written, compared with its
descriptor → only then the snapshot (cache) or the version (store) appears, then the signature
records beside it, and the local alias flips last (the store's side is the one sync,
`registry.store.transfer`). A pull ignores signatures.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

from manifests import Manifest, SignatureRecord
from registry import layout
from registry.cache.imported import IncomingFile, import_files
from registry.cache.plan import unsafe_reason
from registry.cache.records import Snapshot
from registry.errors import Conflict, IntegrityError, NotFound, UsageError
from registry.incoming import sized
from registry.oci import media, uploads
from registry.oci.archive import ArchiveTarget
from registry.oci.base import BaseImage
from registry.oci.image import pack_image
from registry.oci.layout import LayoutTarget
from registry.oci.pack import Blob, Packed, pack
from registry.oci.reference import DIGEST, ArchiveRef, LayoutRef, OciRef
from registry.oci.registry import RegistryTarget
from registry.oci.signatures import admitted, push_signatures, read_signatures
from registry.oci.target import FetchedManifest, Target
from registry.oci.unpack import ImageReader
from registry.progress import NoProgress, Progress
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.transfer import Offer, PushOutcome, Trust

#: The mreg manifest layer is small; a larger one is not ours.
MAX_MREG_MANIFEST = 16 << 20


def open_target(ref: OciRef | LayoutRef, *, insecure: bool = False, create: bool = False,
                chunk: int | None = None, images: bool = True, sessions: Path | None = None,
                stop: threading.Event | None = None) -> Target:
    """The target a reference names (a layout or archive is created for a push); for reading, with `images`, mreg
    images read as the versions they carry (`unpack`). `sessions`: where a push to a registry keeps its resumable
    uploads (`registry.oci.uploads`); `stop`: set, such a push ends at the next chunk."""
    target: Target
    if isinstance(ref, ArchiveRef):
        target = ArchiveTarget(ref, create=create)
    elif isinstance(ref, LayoutRef):
        target = LayoutTarget(ref, create=create)
    else:
        target = RegistryTarget(ref, insecure=insecure, sessions=sessions, stop=stop,
                                **({"chunk": chunk, "monolithic_max": chunk} if chunk else {}))
    return target if create or not images else ImageReader(target)


def close_target(target: Target) -> None:
    """Release what a target holds (connections; an archive left unfinished is abandoned)."""
    close = getattr(target, "close", None)
    if close is not None:
        close()


class OciSink:
    """An OCI target as a push sends to it (`registry.store.transfer.push`): the version packed (`packed`), each
    missing blob streamed (chunked when large, resumed after an interruption), the manifest put under the tag;
    a tag that names the same digest already is reused, one naming another is a Conflict unless forced."""

    #: A blob the registry has is checked against its digest there: a tag naming this digest is the whole artifact.
    repairs = False
    #: One blob at a time: a Ctrl-C stops the push at the next chunk, resumable.
    workers = 1

    def __init__(self, store: LocalStore, target: Target, tag: str, packed: Packed, current: FetchedManifest | None,
                 *, force: bool = False) -> None:
        self.store, self.target, self.tag, self.packed, self.current, self.force = \
            store, target, tag, packed, current, force
        self.by_digest = {b.digest: b for b in packed.blobs}

    @classmethod
    def of(cls, store: LocalStore, version: Version, target: Target, tag: str, *, force: bool = False,
           progress: Progress | None = None, as_image: bool = False, base: BaseImage | None = None) -> OciSink:
        """The sink of a version's push under `tag`: packed as a ModelPack artifact, or a regular image (over `base`
        when given), beside what the tag names now."""
        raw = (Path(version.path) / layout.MANIFEST).read_bytes()
        packed = pack_image(store.root, version.manifest, raw, progress or NoProgress(), base) if as_image else \
            pack(version.manifest, raw)
        return cls(store, target, tag, packed, target.get_manifest(tag), force=force)

    def blobs(self, version: Version) -> dict[str, int]:
        """The packed blobs (config first), by digest."""
        return {b.digest: b.size for b in self.packed.blobs}

    def existing(self, version: Version) -> tuple[Version, str] | None:
        """The version, when the tag names its digest already; a Conflict when it names another, unless forced."""
        current, packed = self.current, self.packed
        if current is not None and current.digest == packed.digest:
            return version, packed.digest
        if current is not None and not self.force:
            raise Conflict(f"{self.target.location}:{self.tag} already names {current.digest[:19]}…, not this version "
                           f"({packed.digest[:19]}…)",
                           hint="push under another tag, or pass --force to move the tag (readers of the old "
                                "digest keep it; the tag is not compare-and-swap)")
        return None

    def sending(self, blobs: Iterable[str]) -> AbstractContextManager[None]:
        """gc leaves the upload sessions of a running push alone."""
        return uploads.pushing(self.store.root)

    def sizes(self, blobs: list[str]) -> list[int | None]:
        """Each blob's size at the target, one after another."""
        return [self.target.blob_size(d) for d in blobs]

    def damaged(self, present: dict[str, int], progress: Progress) -> list[str]:
        """None: the target checks each blob's digest itself."""
        return []

    def send_blob(self, local: LocalStore, blob: str, advance: Callable[[int], None]) -> int:
        """A layer from its source, a small blob made here through a file, a file's blob from the store."""
        b = self.by_digest[blob]
        if b.source is not None:
            return self.target.upload_blob(b.digest, b.size, b.source, advance)
        if b.data is not None:
            return _send_small(local, self.target, b, advance)
        return self.target.upload_blob(b.digest, b.size, layout.blob_path(local.root, b.digest.split(":", 1)[1]),
                                       advance)

    def publish(self, version: Version) -> tuple[Version, str]:
        """The manifest under the tag; then the registry's upload sessions of this target are stale."""
        self.target.put_manifest(self.packed.manifest, media.OCI_MANIFEST, self.tag)
        if isinstance(self.target, RegistryTarget) and self.target.sessions is not None:
            self.target.sessions.clear()  # every blob is there now: what is left of this target is stale
        return version, self.packed.digest

    def send_signatures(self, records: list[SignatureRecord], published: Version) -> int:
        """Each record a referrer of the manifest, unless listed already."""

        def send(b: Blob) -> None:  # a signature's blobs: a few kilobytes, not worth a progress line
            _send_small(self.store, self.target, b, lambda _n: None)

        return push_signatures(records, self.target, self.packed.manifest, send)

    def outcome(self, common: PushOutcome) -> PushOutcome:
        """The tag, and the digest it named before when the push moved it."""
        current = self.current
        moved = None if current is None or current.digest == self.packed.digest else current.digest
        return replace(common, tag=self.tag, replaced=moved)


def _send_small(store: LocalStore, target: Target, b: Blob, advance: Callable[[int], None]) -> int:
    assert b.data is not None
    tmp = _spill(store, b.data)
    try:
        return target.upload_blob(b.digest, b.size, tmp, advance)
    finally:
        tmp.unlink(missing_ok=True)


def _spill(store: LocalStore, data: bytes) -> Path:
    """Small blobs made here (config, mreg manifest) go through a file, like every other blob."""
    tmp = layout.tmp_dir(store.root)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"oci-{os.getpid()}-{threading.get_ident()}-{hashlib.sha256(data).hexdigest()[:16]}"
    path.write_bytes(data)
    return path


# -- reading an artifact --------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """A file layer of an artifact: its path (title), digest, size and media type."""

    path: str
    digest: str
    size: int
    media_type: str
    format: str | None


@dataclass(frozen=True)
class ReadArtifact:
    """A manifest read and checked, its file layers, and mreg's manifest when the artifact carries one."""

    manifest: FetchedManifest
    layers: tuple[Layer, ...]
    mreg: tuple[Manifest, bytes] | None


def _hostile(where: str, why: str) -> IntegrityError:
    return IntegrityError(f"{where}: {why}", hint="this artifact is damaged or was not written for a model; "
                                                  "nothing was written")


def read_artifact(target: Target, reference: str | None) -> ReadArtifact:
    """The manifest a reference names, every descriptor checked before anything is fetched."""
    got = target.get_manifest(reference or "")
    where = f"{target.location}{'@' if reference and reference.startswith('sha256:') else ':'}{reference or ''}"
    if got is None:
        raise NotFound(f"{where} does not exist", hint="check the repository and tag (`skopeo list-tags`)")
    if reference and reference.startswith("sha256:") and got.digest != reference:
        raise _hostile(where, f"the manifest served hashes to {got.digest[:19]}…")
    try:
        doc = json.loads(got.data)
    except ValueError:
        raise _hostile(where, "the manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or not isinstance(doc.get("layers"), list):
        raise _hostile(where, "not an OCI image manifest")
    if doc.get("mediaType", got.media_type) == media.OCI_INDEX or "manifests" in doc:
        raise UsageError(f"{where} is an image index, not one artifact", hint="give the digest of one manifest")
    config = doc.get("config") or {}
    kind = doc.get("artifactType") or config.get("mediaType", "")
    if kind in media.IMAGE_CONFIG_TYPES:
        raise UsageError(f"{where} is a container image mreg did not make, not a model artifact",
                         hint="pull a ModelPack artifact, or an image made by `mreg push --as-image`")
    raw_layers = [d for d in doc["layers"] if isinstance(d, dict)]
    if len(raw_layers) != len(doc["layers"]):
        raise _hostile(where, "a layer descriptor is not an object")
    if kind not in media.ARTIFACT_TYPES and kind not in media.CONFIG_TYPES and not all(
            media.TITLE in (d.get("annotations") or {}) for d in raw_layers):
        raise UsageError(f"{where} is not a model artifact (type {kind!r})",
                         hint="pull ModelPack (application/vnd.cncf.model.*) or ORAS artifacts with titled layers")
    layers: list[Layer] = []
    mreg: tuple[Manifest, bytes] | None = None
    for d in raw_layers:
        digest, size, mt = d.get("digest"), d.get("size"), str(d.get("mediaType", ""))
        if not isinstance(digest, str) or not DIGEST.match(digest) or not isinstance(size, int) or size < 0:
            raise _hostile(where, f"a layer has a bad digest or size ({str(digest)[:80]!r})")
        notes = d.get("annotations") or {}
        if mt == media.MREG_MANIFEST:
            mreg = _mreg_manifest(target, where, digest, size)
            continue
        title = notes.get(media.TITLE)
        if not isinstance(title, str):
            continue  # an untitled layer is not a file
        if (why := unsafe_reason(title)) is not None:
            raise _hostile(where, f"layer title {title[:80]!r}: {why}")
        if not media.is_raw_file(mt) and not media.is_oras_file(mt, str(config.get("mediaType", "")), notes):
            raise UsageError(f"{where}: layer {title} is {mt}, not a raw file",
                             hint="images (--as-image, tar layers) are for container runtimes; pull the artifact")
        layers.append(Layer(title, digest, size, mt, notes.get(media.MREG_FORMAT)))
    paths = [layer.path for layer in layers]
    if len(set(paths)) != len(paths):
        raise _hostile(where, "two layers have the same title")
    return ReadArtifact(got, tuple(layers), mreg)


def _mreg_manifest(target: Target, where: str, digest: str, size: int) -> tuple[Manifest, bytes]:
    if size > MAX_MREG_MANIFEST:
        raise _hostile(where, f"the mreg manifest layer is {size} bytes")
    data = b"".join(sized(target.open_blob(digest), size, f"{where}: the mreg manifest layer",
                          hint="this artifact is damaged or was not written for a model; nothing was written"))
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise _hostile(where, f"the mreg manifest layer does not match its digest {digest[:19]}…")
    try:
        return Manifest.model_validate_json(data), data
    except ValueError as e:
        raise _hostile(where, f"the mreg manifest layer is not a valid manifest ({type(e).__name__})") from None


def _chunks(target: Target, digest: str) -> Callable[[], Iterator[bytes]]:
    return lambda: target.open_blob(digest)


# -- pull into the cache ----------------------------------------------------------------------------


def cache_repo(ref: OciRef | LayoutRef) -> str:
    """The cache's repository id for an OCI source (`oci/HOST/REPO`, `oci-layout/DIR-NAME-HASH` or
    `oci-archive/FILE-NAME-HASH`)."""
    if isinstance(ref, LayoutRef):
        path = str(ref.path.expanduser().resolve())
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", ref.path.name).strip("-.") or "layout"
        kind = "oci-archive" if isinstance(ref, ArchiveRef) else "oci-layout"
        return f"{kind}/{slug}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    return "oci/" + re.sub(r"[^A-Za-z0-9._-]+", "-", f"{ref.host}/{ref.repository}").strip("-.")


def snapshot_layers(art: ReadArtifact) -> list[tuple[str, Layer]]:
    """The files a source snapshot holds (pure): an mreg version's hf artifact at the root (what a conversion
    reads), else every file layer at its title."""
    if art.mreg is not None:
        hf = next((a for a in art.mreg[0].artifacts if a.format == "hf"), None)
        if hf is not None:
            prefix = f"{hf.path}/"
            return [(layer.path[len(prefix):], layer) for layer in art.layers if layer.path.startswith(prefix)]
    return [(layer.path, layer) for layer in art.layers]


def pull(cache: Path, ref: OciRef | LayoutRef, target: Target, *, include: Sequence[str] = (),
         exclude: Sequence[str] = (), allow_pickle: bool = False, progress: Progress | None = None) -> Snapshot:
    """An artifact into the cache as a pinned snapshot (commit = the manifest digest's hex), every layer verified."""
    art = read_artifact(target, ref.digest or ref.tag)
    files = [IncomingFile(path, layer.size, layer.digest.split(":", 1)[1], _chunks(target, layer.digest))
             for path, layer in snapshot_layers(art)]
    if not files:
        raise NotFound(f"{ref} has no file layers", hint="push a version or model files there first")
    return import_files(cache, cache_repo(ref), art.manifest.digest.split(":", 1)[1], str(ref), files, kind="oci",
                        ref=None if ref.digest else ref.tag, include=include, exclude=exclude,
                        allow_pickle=allow_pickle, progress=progress)


# -- sync into a local store ------------------------------------------------------------------------


class OciSource:
    """An artifact as a sync reads it (`registry.store.transfer.sync`): the manifest (its digest checked against the
    reference when it is one) → the mreg manifest layer → the signature referrers → the layers, one at a time."""

    aliases = False  # a tag is a name, not an alias: no rollout to follow
    workers = 1
    repair_hint = "push the version again from a good store"

    def __init__(self, target: Target, reference: str | None, name: str | None = None) -> None:
        self.target, self.reference, self.name = target, reference, name
        self.location = target.location

    def head(self) -> str:
        """The digest of the manifest the reference names now."""
        got = self.target.get_manifest(self.reference or "")
        return got.digest if got is not None else ""

    def offer(self, trust: Trust | None) -> Offer:
        """The mreg version the artifact carries, every file among its layers; the signature referrers that verify
        under the model's trust policy (all of them without one)."""
        target, reference = self.target, self.reference
        art = read_artifact(target, reference)
        if art.mreg is None:
            raise UsageError(f"{target.location}:{reference} carries no mreg manifest, so it is not a version to "
                             "sync", hint="pull it into the cache and convert it: `mreg convert oci://… --to hf "
                                          "--name NAME`")
        manifest, raw = art.mreg
        if self.name is not None and self.name != manifest.name:
            raise Conflict(f"{target.location}:{reference} holds {manifest.name}@{manifest.version}, not {self.name}",
                           hint=f"sync it as {manifest.name}, or give the tag of {self.name}")
        by_digest = {layer.digest.split(":", 1)[1]: layer for layer in art.layers}
        for a in manifest.artifacts:
            for f in a.files:
                layer = by_digest.get(f.sha256)
                if layer is None or layer.size != f.size:
                    raise _hostile(f"{target.location}:{reference}", f"{a.path}/{f.path} is not among the layers")
        version = Version(manifest.name, manifest.version, manifest, hashlib.sha256(raw).hexdigest(),
                          f"{target.location}@{art.manifest.digest}")
        keep = admitted(read_signatures(target, art.manifest.digest, version), version,
                        trust(manifest.name) if trust is not None else None, f"{target.location}:{reference or ''}")
        return Offer(version, raw, art.manifest.digest, tuple(keep))

    def open_blob(self, sha256: str) -> Iterator[bytes]:
        """A layer's bytes; NotFound when the target has none."""
        return self.target.open_blob(f"sha256:{sha256}")

    def blob_label(self, sha256: str) -> str:
        """`layer sha256:ab12…`."""
        return f"layer sha256:{sha256[:12]}…"
