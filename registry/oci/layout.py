"""An OCI image layout directory as a push or pull target (what `skopeo copy oci:DIR …` reads and writes).

Layout (names in `registry.layout`)::

    <dir>/oci-layout              {"imageLayoutVersion": "1.0.0"}
    <dir>/index.json              manifests, tagged by org.opencontainers.image.ref.name (rewritten atomically);
                                  referrers (signatures) listed untagged, with their artifactType and subject
    <dir>/blobs/sha256/<hex>      every blob, written to a temporary name, hashed, then renamed

Blobs are copied, not linked: the directory is made to be carried across an air gap.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from registry import atomic, layout
from registry.digest import file_chunks, write_hashed
from registry.errors import IntegrityError, NotFound
from registry.oci import media, referrers
from registry.oci.reference import DIGEST, LayoutRef
from registry.oci.target import MAX_MANIFEST, BlobBody, FetchedManifest


class LayoutTarget:
    """An OCI image layout on this machine's filesystem."""

    def __init__(self, ref: LayoutRef, *, create: bool = False) -> None:
        self.root = ref.path
        self.location = str(ref.path)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
            marker = self.root / layout.OCI_LAYOUT_FILE
            if not marker.exists():
                atomic.write_bytes(marker, json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        elif not (self.root / layout.OCI_LAYOUT_FILE).is_file():
            raise NotFound(f"{self.root} is not an OCI image layout (no {layout.OCI_LAYOUT_FILE} file)",
                           hint="give a directory written by `mreg push … oci-layout:DIR` or `skopeo copy … oci:DIR`")

    def _blob(self, digest: str) -> Path:
        if not DIGEST.match(digest):  # the name becomes a path: nothing else may
            raise IntegrityError(f"{self.location}: {digest[:80]!r} is not a sha256 digest",
                                 hint="the layout's index or manifest is damaged")
        return layout.oci_blob_path(self.root, digest)

    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the layout has, or None."""
        try:
            return self._blob(digest).stat().st_size
        except FileNotFoundError:
            return None

    def upload_blob(self, digest: str, size: int, path: BlobBody, advance: Callable[[int], None]) -> int:
        """Copy a file (or a source's bytes) in as the blob `digest`, hashed while copied; nothing on a mismatch
        (and nothing resumes: 0)."""
        self._write(digest, file_chunks(path) if isinstance(path, Path) else path.chunks(), advance)
        return 0

    def _write(self, digest: str, chunks: Any, advance: Callable[[int], None] | None = None) -> None:
        dest = self._blob(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = atomic.temp_name(dest)
        try:
            actual = write_hashed(tmp, chunks, advance)
            if f"sha256:{actual}" != digest:
                raise IntegrityError(f"the bytes for blob {digest[:19]}… hash to sha256:{actual[:12]}…",
                                     hint="run `mreg verify --all`: the local blob may be damaged")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """A blob's bytes (the caller verifies them)."""
        path = self._blob(digest)
        if not path.is_file():
            raise NotFound(f"{self.location} has no blob {digest[:19]}… although a manifest names it",
                           hint="copy the whole layout directory again")
        return file_chunks(path)

    def _index(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.root / layout.OCI_INDEX_FILE).read_bytes())
        except FileNotFoundError:
            return {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": []}
        except ValueError:
            raise IntegrityError(f"{self.root / layout.OCI_INDEX_FILE} is not JSON",
                                 hint="the layout is damaged: copy it again") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests", []), list):
            raise IntegrityError(f"{self.root / layout.OCI_INDEX_FILE} is not an OCI index", hint="copy it again")
        return doc

    def get_manifest(self, reference: str) -> FetchedManifest | None:
        """The manifest a tag, a digest, or (with "" and a single entry) the index names."""
        entry = select_entry(self.location, self._index(), reference)
        if entry is None and DIGEST.match(reference) and self.blob_size(reference) is not None:
            entry = {"digest": reference}  # by digest, a manifest an index inside lists (a referrer)
        if entry is None:
            return None
        path = self._blob(str(entry.get("digest")))
        if not path.is_file() or path.stat().st_size > MAX_MANIFEST:
            raise IntegrityError(f"{self.location}: the manifest {entry.get('digest')} is missing or too large",
                                 hint="copy the layout again")
        data = path.read_bytes()
        return FetchedManifest(data, str(entry.get("mediaType", media.OCI_MANIFEST)),
                               "sha256:" + hashlib.sha256(data).hexdigest())

    def put_manifest(self, data: bytes, media_type: str, tag: str) -> None:
        """Write the manifest blob, then the index with the tag moved to it (one rename)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._write(digest, iter([data]))
        with atomic.flock(layout.oci_index_lock(self.root)):
            index = retag(self._index(), digest, media_type, len(data), tag)
            atomic.write_bytes(self.root / layout.OCI_INDEX_FILE, json.dumps(index, indent=2).encode())

    def referrers(self, subject: str) -> list[dict[str, Any]]:
        """The index's manifests whose `subject` is this digest, and a tag-schema index (`skopeo copy` of one)."""
        return index_referrers(self._index(), subject, self.get_manifest, self._read_small)

    def _read_small(self, digest: str) -> bytes | None:
        path = self._blob(digest)
        try:
            return path.read_bytes() if path.stat().st_size <= MAX_MANIFEST else None
        except OSError:
            return None

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> None:
        """Write the manifest blob, then list it in the index, untagged (once)."""
        entry = referrers.descriptor(data, media_type)
        self._write(entry["digest"], iter([data]))
        with atomic.flock(layout.oci_index_lock(self.root)):
            index = with_referrer(self._index(), entry)
            if index is not None:
                atomic.write_bytes(self.root / layout.OCI_INDEX_FILE, json.dumps(index, indent=2).encode())


def index_referrers(index: dict[str, Any], subject: str, get_manifest: Callable[[str], FetchedManifest | None],
                    read: Callable[[str], bytes | None]) -> list[dict[str, Any]]:
    """The referrers of `subject` an OCI index lists (a layout's or an archive's): untagged manifests whose
    `subject` it is (their artifactType and annotations read from the manifest itself: another tool's entry may
    carry neither), and the entries of a tag-schema index copied in (`skopeo copy` of one)."""
    out: dict[str, dict[str, Any]] = {}
    for m in index.get("manifests", []):
        if not isinstance(m, dict) or not isinstance(m.get("digest"), str):
            continue
        name = (m.get("annotations") or {}).get(media.REF_NAME)
        if m.get("mediaType") == media.OCI_INDEX and name == referrers.tag_for(subject):
            got = get_manifest(name)
            out.update((e["digest"], e) for e in referrers.entries(got.data if got else None)
                       if isinstance(e.get("digest"), str))
        elif m.get("mediaType") == media.OCI_MANIFEST and m["digest"] not in out:
            data = read(m["digest"]) if DIGEST.match(m["digest"]) else None
            try:
                doc = json.loads(data) if data is not None else None
                if isinstance(doc, dict) and (doc.get("subject") or {}).get("digest") == subject:
                    out[m["digest"]] = referrers.descriptor(data or b"", media.OCI_MANIFEST)
            except (ValueError, AttributeError):
                continue  # a damaged or missing entry refers to nothing; reading it as an artifact says why
    return list(out.values())


def with_referrer(index: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
    """The index with a referrer's untagged entry added (pure), or None when it is already listed."""
    if any(isinstance(m, dict) and m.get("digest") == entry["digest"] for m in index.get("manifests", [])):
        return None
    return {**index, "manifests": [*index.get("manifests", []), entry]}


def select_entry(location: str, index: dict[str, Any], reference: str) -> dict[str, Any] | None:
    """The index entry a tag or digest names, or with "" the only artifact (pure; several is a NotFound; a
    signature's untagged entry is not an artifact)."""
    entries = [m for m in index.get("manifests", []) if isinstance(m, dict)]
    if reference:
        hits = [m for m in entries if m.get("digest") == reference
                or (m.get("annotations") or {}).get(media.REF_NAME) == reference]
    else:
        entries = [m for m in entries if not referrers.is_listing_entry(m)]
        hits = entries if len(entries) == 1 else []
        if len(entries) > 1:
            tags = sorted(str((m.get("annotations") or {}).get(media.REF_NAME)) for m in entries)
            raise NotFound(f"{location} holds {len(entries)} manifests; say which",
                           hint=f"add :TAG to the layout reference ({', '.join(tags[:5])})")
    return hits[-1] if hits else None


def retag(index: dict[str, Any], digest: str, media_type: str, size: int, tag: str) -> dict[str, Any]:
    """The index with `tag` moved to a manifest (pure)."""
    kept = [m for m in index.get("manifests", []) if (m.get("annotations") or {}).get(media.REF_NAME) != tag]
    kept.append({"mediaType": media_type, "digest": digest, "size": size, "annotations": {media.REF_NAME: tag}})
    return {**index, "manifests": kept}
