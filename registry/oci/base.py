"""A base image under `--as-image` (`--base IMAGE`): what a KServe modelcar needs, a shell, below the model's layers.

Read from any target (a registry, a layout, an archive): the manifest (from an image index, the
linux/amd64 one), then its config, hashed and checked; the layers are not fetched here. The
image mreg pushes then has the base's layers first (as they are: same digests, Docker media
types renamed to their OCI equals), the base's config (platform, Env, Cmd, …) with mreg's labels
added and its diff ids extended, and `org.opencontainers.image.base.{name,digest}` annotations.
Base layers the destination lacks are streamed from where the base is, checked by the destination
against their digests like any blob.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from registry.errors import IntegrityError, NotFound, UsageError
from registry.oci import media
from registry.oci.pack import Blob
from registry.oci.reference import DIGEST
from registry.oci.target import Target, read_capped

PLATFORM = ("linux", "amd64")
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
#: Layer types a base may have, with the OCI name each is given in mreg's manifest (the bytes are the same).
LAYER_TYPES = {
    media.TAR_LAYER: media.TAR_LAYER,
    f"{media.TAR_LAYER}+gzip": f"{media.TAR_LAYER}+gzip",
    f"{media.TAR_LAYER}+zstd": f"{media.TAR_LAYER}+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": f"{media.TAR_LAYER}+gzip",
    "application/vnd.docker.image.rootfs.diff.tar": media.TAR_LAYER,
}


class TargetBlob:
    """A blob of another target, streamed from it when sent (a `BlobSource`)."""

    def __init__(self, target: Target, digest: str, size: int) -> None:
        self.target, self.digest, self._size = target, digest, size

    @property
    def size(self) -> int:
        """The blob's size, as its descriptor says."""
        return self._size

    def chunks(self, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The blob's bytes from `start` (read from its beginning: a base is small)."""
        at, left = 0, self._size - start if length is None else length
        for block in self.target.open_blob(self.digest):
            if left <= 0:
                return
            if at + len(block) > start:
                piece = block[max(0, start - at):][:left]
                left -= len(piece)
                yield piece
            at += len(block)


@dataclass(frozen=True)
class BaseImage:
    """A base image, checked: its name, manifest digest, config and layers (Blobs streamed from where it is)."""

    name: str
    digest: str
    config: dict[str, Any]
    layers: tuple[Blob, ...]
    #: The plain image reference (`host/repo:tag`) of a base in a registry; None for a layout or an archive.
    image_name: str | None = None


def _bad(where: str, why: str) -> UsageError:
    return UsageError(f"the base image {where} {why}",
                      hint="give a container image (for a KServe modelcar, one with a shell: busybox)")


def _json(where: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise IntegrityError(f"the base image {where}: a manifest or config is not JSON",
                             hint="give another base image") from None
    if not isinstance(doc, dict):
        raise IntegrityError(f"the base image {where}: a manifest or config is not an object",
                             hint="give another base image")
    return doc


def _small_blob(target: Target, where: str, digest: str) -> bytes:
    data = read_capped(target.open_blob(digest), f"the base image {where}: blob {digest[:19]}…",
                       hint="give another base image")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise IntegrityError(f"the base image {where}: blob {digest[:19]}… does not match its digest",
                             hint="give another base image")
    return data


def read_base(target: Target, reference: str | None, name: str, image_name: str | None = None) -> BaseImage:
    """The base image a reference names (linux/amd64 from an index), its config read and checked."""
    got = target.get_manifest(reference or "")
    if got is None:
        raise NotFound(f"the base image {name} does not exist", hint="check its repository and tag")
    data, digest = got.data, got.digest
    doc = _json(name, data)
    if doc.get("mediaType", got.media_type) in (media.OCI_INDEX, DOCKER_LIST) or "manifests" in doc:
        entries = [m for m in doc.get("manifests") or [] if isinstance(m, dict)]
        pick = next((m for m in entries if isinstance(m.get("platform"), dict)
                     and (m["platform"].get("os"), m["platform"].get("architecture")) == PLATFORM), None)
        if pick is None or not isinstance(pick.get("digest"), str) or not DIGEST.match(pick["digest"]):
            raise _bad(name, f"has no {'/'.join(PLATFORM)} image in its index")
        digest = pick["digest"]
        child = target.get_manifest(digest)
        data = child.data if child is not None else _small_blob(target, name, digest)
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise IntegrityError(f"the base image {name}: its {'/'.join(PLATFORM)} manifest does not match its digest",
                                 hint="give another base image")
        doc = _json(name, data)
    config = doc.get("config")
    if not isinstance(config, dict) or config.get("mediaType") not in media.IMAGE_CONFIG_TYPES:
        raise _bad(name, "is not a container image (its config is not an image config)")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list):
        raise _bad(name, "has no layer list")
    layers: list[Blob] = []
    for d in raw_layers:
        if not isinstance(d, dict) or not isinstance(d.get("digest"), str) or not DIGEST.match(d["digest"]) \
                or not isinstance(d.get("size"), int) or d["size"] < 0:
            raise IntegrityError(f"the base image {name}: a layer has a bad digest or size", hint="give another one")
        kind = LAYER_TYPES.get(str(d.get("mediaType")))
        if kind is None:
            raise _bad(name, f"has a layer of type {str(d.get('mediaType'))[:80]!r}, not a tar layer")
        layers.append(Blob(d["digest"], d["size"], kind, source=TargetBlob(target, d["digest"], d["size"])))
    if not isinstance(config.get("digest"), str) or not DIGEST.match(config["digest"]):
        raise IntegrityError(f"the base image {name}: its config has a bad digest", hint="give another one")
    cfg = _json(name, _small_blob(target, name, config["digest"]))
    diff_ids = (cfg.get("rootfs") or {}).get("diff_ids") if isinstance(cfg.get("rootfs"), dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layers) or \
            not all(isinstance(x, str) and DIGEST.match(x) for x in diff_ids):
        raise IntegrityError(f"the base image {name}: its config's diff ids do not match its layers",
                             hint="give another base image")
    return BaseImage(name, digest, cfg, tuple(layers), image_name)
