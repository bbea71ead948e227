"""A version as a ModelPack artifact (pure): the config, the layers and the manifest, byte for byte reproducible.

The manifest's bytes depend only on the version (no push time), so pushing the same version
twice gives the same digest and a tag that already names it is left as it is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from manifests import GGUFRequirements, Manifest, TensorRTRequirements
from registry.oci import media
from registry.oci.target import BlobSource

MREG_MANIFEST_TITLE = ".mreg/manifest.json"


@dataclass(frozen=True)
class Blob:
    """A blob of the artifact: a store blob (by its sha256), bytes made here (config, mreg manifest), or bytes
    made while sent (an image's tar layer)."""

    digest: str
    size: int
    media_type: str
    data: bytes | None = None
    source: BlobSource | None = None


@dataclass(frozen=True)
class Packed:
    """Everything a push sends: the blobs (config first), and the manifest that names them (sent last)."""

    blobs: tuple[Blob, ...]
    manifest: bytes
    digest: str


def canonical(doc: Any) -> bytes:
    """JSON with sorted keys and no spaces: the same document always gives the same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(data: bytes) -> str:
    """`sha256:HEX` of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(blob: Blob, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The OCI descriptor of a blob (media type, digest, size, annotations when any)."""
    d: dict[str, Any] = {"mediaType": blob.media_type, "digest": blob.digest, "size": blob.size}
    if annotations:
        d["annotations"] = annotations
    return d


def model_config(m: Manifest, layer_digests: list[str]) -> dict[str, Any]:
    """ModelPack's config: descriptor (name, version, source), config (architecture, format, …), modelfs."""
    source = m.source
    descriptor: dict[str, Any] = {"name": m.name, "version": str(m.version), "revision": source.commit,
                                  "createdAt": m.created.at.isoformat().replace("+00:00", "Z"),
                                  "authors": [m.created.user]}
    if source.kind == "hub":
        descriptor["sourceURL"] = f"{(source.endpoint or 'https://huggingface.co').rstrip('/')}/{source.repo}"
    config: dict[str, Any] = {}
    if m.model and m.model.architecture:
        config["architecture"] = m.model.architecture
    formats = [a.format for a in m.artifacts]
    config["format"] = ",".join("safetensors" if f == "hf" else f for f in formats)
    for art in m.artifacts:
        req = art.requirements
        if isinstance(req, GGUFRequirements):
            config["quantization"] = req.quantization
        elif isinstance(req, TensorRTRequirements):
            config["precision"] = req.precision
    return {"descriptor": descriptor, "config": config,
            "modelfs": {"type": "layers", "diffIds": layer_digests}}


def pack(m: Manifest, manifest_raw: bytes) -> Packed:
    """The artifact of a version: one raw layer per file (`<format dir>/<path>`), then mreg's manifest."""
    layers: list[tuple[Blob, dict[str, str]]] = []
    for art in m.artifacts:
        for f in art.files:
            title = f"{art.path}/{f.path}"
            layers.append((Blob(f"sha256:{f.sha256}", f.size, media.layer_type(f.path)),
                           {media.TITLE: title, media.FILEPATH: title, media.MREG_FORMAT: art.format}))
    own = Blob(digest_of(manifest_raw), len(manifest_raw), media.MREG_MANIFEST, manifest_raw)
    layers.append((own, {media.TITLE: MREG_MANIFEST_TITLE}))
    config_raw = canonical(model_config(m, [b.digest for b, _ in layers]))
    config = Blob(digest_of(config_raw), len(config_raw), media.MODEL_CONFIG, config_raw)
    doc = {
        "schemaVersion": 2,
        "mediaType": media.OCI_MANIFEST,
        "artifactType": media.MODEL_ARTIFACT,
        "config": descriptor(config),
        "layers": [descriptor(b, a) for b, a in layers],
        "annotations": {media.CREATED: m.created.at.isoformat().replace("+00:00", "Z"),
                        media.MREG_NAME: m.name, media.MREG_VERSION: str(m.version)},
    }
    raw = canonical(doc)
    unique = {b.digest: b for b in [config, *(b for b, _ in layers)]}
    return Packed(tuple(unique.values()), raw, digest_of(raw))
