"""Reading an image mreg made (`push --as-image`) back as the version it carries, so pull and sync take images too.

`ImageReader` wraps a target for reading. A manifest that is an mreg image (an image config, and
a last layer at `models/<name>/manifest.json`) is answered with the ModelPack artifact the same
version packs to (`pack`), under the image's own digest (what was asked for and checked); a file
is then read from its image layer, which must be exactly what `image` makes for that path and
size (the fixed header, the file, zeros) and hash to the layer's digest, while the caller checks
the file against its sha256 as for any artifact. mreg's manifest layer is read and checked the
same way before anything else. Anything else passes through unchanged, so `read_artifact`
refuses an image mreg did not make. Base layers (`--base`) are not files and are never read.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterator
from typing import Any

from manifests import Manifest
from registry import layout
from registry.errors import IntegrityError
from registry.incoming import sized
from registry.oci import media
from registry.oci.image import ROOT, TarLayer, tar_header
from registry.oci.pack import digest_of, pack
from registry.oci.reference import DIGEST
from registry.oci.target import MAX_MANIFEST, BlobBody, FetchedManifest, Target

#: mreg's manifest layer is small (the manifest, one header); a larger one is not ours.
MAX_MANIFEST_LAYER = (16 << 20) + (64 << 10)


HINT = "this image is damaged or was not made by `mreg push --as-image`; nothing was written"


def _hostile(where: str, why: str) -> IntegrityError:
    return IntegrityError(f"{where}: {why}", hint=HINT)


def _same_layers(where: str, diff_ids: object, tail: list[Any]) -> None:
    """mreg's layers are uncompressed, so their digests are the config's last diff ids; a copy that recompressed them
    (or another config) is refused before a layer is read."""
    ids = diff_ids[-len(tail):] if isinstance(diff_ids, list) and len(diff_ids) >= len(tail) else None
    if ids != [d.get("digest") if isinstance(d, dict) else None for d in tail]:
        raise IntegrityError(f"{where}: its layers are not the ones its config lists, in that order (a copy that "
                             "recompressed or reordered them?)",
                             hint="copy the image with its layers as they are (`skopeo copy --preserve-digests`), "
                                  "or push it again with `mreg push --as-image`")


class ImageReader:
    """A target whose mreg images read as the artifacts of their versions (everything else as it is)."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.location = inner.location
        #: file blob (sha256:…) → (its layer's digest, the layer's size, the header, the file's size)
        self._files: dict[str, tuple[str, int, bytes, int]] = {}
        #: small blobs of the artifact made here (config, mreg manifest)
        self._data: dict[str, bytes] = {}

    def blob_size(self, digest: str) -> int | None:
        """A blob's size: an artifact blob of a translated image, or the inner target's."""
        if digest in self._data:
            return len(self._data[digest])
        if digest in self._files:
            return self._files[digest][3]
        return self.inner.blob_size(digest)

    def upload_blob(self, digest: str, size: int, path: BlobBody, advance: Callable[[int], None]) -> int:
        """As the inner target."""
        return self.inner.upload_blob(digest, size, path, advance)

    def put_manifest(self, data: bytes, media_type: str, tag: str) -> None:
        """As the inner target."""
        self.inner.put_manifest(data, media_type, tag)

    def referrers(self, subject: str) -> list[dict[str, Any]]:
        """As the inner target (an image's signatures refer to the image's own manifest)."""
        return self.inner.referrers(subject)

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> None:
        """As the inner target."""
        self.inner.put_referrer(data, media_type, subject)

    def close(self) -> None:
        """Close the inner target."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """A blob's bytes; a file of a translated image unwrapped from its layer, checked as it streams."""
        if digest in self._data:
            return iter([self._data[digest]])
        if digest in self._files:
            return self._unwrap(digest)
        return self.inner.open_blob(digest)

    def get_manifest(self, reference: str) -> FetchedManifest | None:
        """The manifest a reference names; an mreg image as its version's artifact (under the image's digest)."""
        got = self.inner.get_manifest(reference)
        if got is None:
            return None
        try:
            doc = json.loads(got.data)
        except ValueError:
            return got
        layers = doc.get("layers") if isinstance(doc, dict) else None
        config = doc.get("config") if isinstance(doc, dict) else None
        if not isinstance(config, dict) or config.get("mediaType") not in media.IMAGE_CONFIG_TYPES \
                or not isinstance(layers, list) or not layers or not isinstance(layers[-1], dict):
            return got
        where = f"{self.location}:{reference}"
        path = (layers[-1].get("annotations") or {}).get(media.MREG_PATH)
        labels: dict[str, Any] = {}
        diff_ids: object = None
        if path is None:  # a copy by another tool (podman, skopeo, crane) keeps the config but no layer annotations
            labels, diff_ids = self._config(where, config)
            name = labels.get(media.MREG_NAME)
            path = f"{ROOT}/{name}/{layout.MANIFEST}" if isinstance(name, str) and "/" not in name else None
            if path is not None:
                _same_layers(where, diff_ids, layers[-1:])
        if not isinstance(path, str) or not path.startswith(f"{ROOT}/") or not path.endswith(f"/{layout.MANIFEST}"):
            return got
        return self._translate(where, got, layers, path, labels.get(media.MREG_MANIFEST_DIGEST),
                               diff_ids if labels else None)

    def _config(self, where: str, config: dict[str, Any]) -> tuple[dict[str, Any], object]:
        """The image config's labels and diff ids (the config read whole, capped, and checked against its digest)."""
        digest, size = config.get("digest"), config.get("size")
        if not isinstance(digest, str) or not DIGEST.match(digest) or not isinstance(size, int) \
                or not 0 < size <= MAX_MANIFEST:
            return {}, None
        data = b"".join(sized(self.inner.open_blob(digest), size, f"{where}: its config", HINT))
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise _hostile(where, f"its config does not match its digest {digest[:19]}…")
        try:
            doc = json.loads(data)
        except ValueError:
            return {}, None
        inner = doc.get("config") if isinstance(doc, dict) else None
        labels = inner.get("Labels") if isinstance(inner, dict) else None
        rootfs = doc.get("rootfs") if isinstance(doc, dict) else None
        return (labels if isinstance(labels, dict) else {}), (rootfs.get("diff_ids") if isinstance(rootfs, dict)
                                                               else None)

    def _translate(self, where: str, got: FetchedManifest, layers: list[Any], path: str,
                   manifest_digest: object = None, diff_ids: object = None) -> FetchedManifest:
        """The artifact of the version an mreg image carries. Its layers are matched by position, as `image` lays
        them out (a base's first, then one per file in the manifest's order, the manifest last), since a copy by
        another tool keeps the layers and their order but not their annotations; each is held to the size and,
        as it streams, the fixed tar header of its path."""
        raw = self._manifest_layer(where, layers[-1], path)
        try:
            m = Manifest.model_validate_json(raw)
        except ValueError as e:
            raise _hostile(where, f"its mreg manifest is not a valid manifest ({type(e).__name__})") from None
        if path != f"{ROOT}/{m.name}/{layout.MANIFEST}":
            raise _hostile(where, f"its mreg manifest is for {m.name}, at {path[:80]!r}")
        if manifest_digest is not None and manifest_digest != digest_of(raw):
            raise _hostile(where, "its labels name another mreg manifest than the one it carries")
        files = [(f"{ROOT}/{m.name}/{art.path}/{f.path}", f) for art in m.artifacts for f in art.files]
        if len(layers) < len(files) + 1:
            raise _hostile(where, f"{len(layers)} layers, fewer than the {len(files) + 1} of its version")
        if diff_ids is not None:  # recognised by its labels: its layers must be the ones its config lists
            _same_layers(where, diff_ids, layers[-1 - len(files):])
        for (p, f), d in zip(files, layers[-1 - len(files):-1], strict=True):
            layer = TarLayer(p, tar_header(p, f.size), f.size)
            notes = d.get("annotations") if isinstance(d, dict) else None
            named = notes.get(media.MREG_PATH, p) if isinstance(notes, dict) else p
            if not isinstance(d, dict) or named != p or not isinstance(d.get("digest"), str) \
                    or not DIGEST.match(d["digest"]) or d.get("size") != layer.size \
                    or d.get("mediaType") not in media.TAR_LAYERS:
                raise _hostile(where, f"no layer of the right size for {p[:80]!r}")
            self._files[f"sha256:{f.sha256}"] = (d["digest"], layer.size, layer.header, f.size)
        packed = pack(m, raw)
        self._data |= {b.digest: b.data for b in packed.blobs if b.data is not None}
        return FetchedManifest(packed.manifest, media.OCI_MANIFEST, got.digest)

    def _manifest_layer(self, where: str, d: dict[str, Any], path: str) -> bytes:
        digest, size = d.get("digest"), d.get("size")
        if not isinstance(digest, str) or not DIGEST.match(digest) or not isinstance(size, int) \
                or not 0 < size <= MAX_MANIFEST_LAYER:
            raise _hostile(where, "its mreg manifest layer has a bad digest or size")
        data = b"".join(sized(self.inner.open_blob(digest), size, f"{where}: its mreg manifest layer", HINT))
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise _hostile(where, f"its mreg manifest layer does not match its digest {digest[:19]}…")
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
                member = tf.getmember(path)
                f = tf.extractfile(member) if member.isreg() else None
                raw = f.read() if f is not None else b""
        except (tarfile.TarError, KeyError, EOFError):
            raise _hostile(where, "its mreg manifest layer is not a tar holding the manifest") from None
        if b"".join(TarLayer(path, tar_header(path, len(raw)), len(raw), data=raw).chunks()) != data:
            raise _hostile(where, "its mreg manifest layer is not one mreg made")
        return raw

    def _unwrap(self, digest: str) -> Iterator[bytes]:
        layer_digest, size, header, file_size = self._files[digest]
        h, at, seen = hashlib.sha256(), 0, b""
        file_end = len(header) + file_size
        for chunk in sized(self.inner.open_blob(layer_digest), size, f"{self.location}: layer {layer_digest[:19]}…",
                           HINT):
            h.update(chunk)
            start, at = at, at + len(chunk)
            if start < len(header):
                seen += chunk[:len(header) - start]
                if not header.startswith(seen):
                    raise _hostile(self.location, f"layer {layer_digest[:19]}… is not the tar mreg makes")
            body = chunk[max(0, len(header) - start):max(0, file_end - start)]
            if body:
                yield body
            tail = chunk[max(0, file_end - start):]
            if tail.count(0) != len(tail):
                raise _hostile(self.location, f"layer {layer_digest[:19]}… has bytes after its file")
        if f"sha256:{h.hexdigest()}" != layer_digest:
            raise _hostile(self.location, f"layer {layer_digest[:19]}… is corrupt (it does not match its digest)")
