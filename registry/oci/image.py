"""A version as a regular OCI image (`mreg push … --as-image`): what containerd and CRI-O pull and Kubernetes
mounts as an image volume (or KServe as a modelcar).

One uncompressed tar layer per file, the file at `models/<name>/<format dir>/<path>`, and mreg's
manifest last at `models/<name>/manifest.json`, so the image says which version it is::

    manifest (PUT last, under the tag)
      config   application/vnd.oci.image.config.v1+json   linux/amd64, Labels, rootfs.diff_ids = the layer digests
      layers   application/vnd.oci.image.layer.v1.tar     models/m/hf/config.json        dev.mreg.path
               application/vnd.oci.image.layer.v1.tar     models/m/hf/model.safetensors
               application/vnd.oci.image.layer.v1.tar     models/m/manifest.json

A layer is `TarLayer`: directory entries for its parents, the file's header, the file, padding
and the end-of-archive blocks. Every header is fixed (mtime 0, uid/gid 0, no user names, 0755
directories, 0644 files; PAX only for a path over 100 bytes, and never a time field), so a
layer's digest depends only on the file's bytes and its path: pushing again sends nothing. The
bytes are made while sent (never the whole file in memory); the digest, needed before the upload,
is one streaming pass over the file, kept in `<store>/caches/oci-image/` per (blob sha256, path),
so only the first push of a file pays it. Diff ids equal the layer digests (uncompressed).

The files are platform-independent; the image config must still name an os and architecture, and
says linux/amd64. Runtimes match platforms only when picking from an image index: a single
manifest, as pushed here, is pulled on a node of any architecture.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests import Manifest
from registry import atomic, layout
from registry.errors import IntegrityError
from registry.oci import media
from registry.oci.base import BaseImage
from registry.oci.pack import Blob, Packed, canonical, descriptor, digest_of
from registry.oci.reference import DIGEST
from registry.progress import NoProgress, Progress

#: Where the files are in the image's filesystem.
ROOT = "models"
#: Bumped whenever the tar bytes change, so cached digests of the old bytes are not used.
TAR_VERSION = 1
BLOCK = 512
READ = 1 << 20
PLATFORM = {"architecture": "amd64", "os": "linux"}


def tar_entry(name: str, *, size: int = 0, directory: bool = False) -> bytes:
    """One fixed tar header (mtime 0, root-owned, no user names, 0755 or 0644; PAX only for a long path)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_header(path: str, size: int) -> bytes:
    """The fixed tar headers of one file at `path`: its parent directories, then the file (pure)."""
    parts = path.split("/")
    dirs = b"".join(tar_entry("/".join(parts[:i]), directory=True) for i in range(1, len(parts)))
    return dirs + tar_entry(path, size=size)


@dataclass(frozen=True)
class TarLayer:
    """A tar of one file, made while read: header, the file's bytes (or `data`), padding, two zero blocks."""

    path: str
    header: bytes
    file_size: int
    file: Path | None = None
    data: bytes | None = None

    @property
    def size(self) -> int:
        """The layer's size in bytes."""
        return len(self.header) + self.file_size + (-self.file_size % BLOCK) + 2 * BLOCK

    def _pieces(self) -> Iterator[tuple[int, bytes | Path]]:
        yield len(self.header), self.header
        yield self.file_size, self.file if self.file is not None else (self.data or b"")
        yield -self.file_size % BLOCK + 2 * BLOCK, b"\0" * (-self.file_size % BLOCK + 2 * BLOCK)

    def chunks(self, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The layer's bytes from `start` (`length` of them, to the end when None)."""
        left = self.size - start if length is None else min(length, self.size - start)
        at = 0
        for n, piece in self._pieces():
            if left <= 0:
                return
            if at + n <= start:
                at += n
                continue
            skip = max(0, start - at)
            take = min(n - skip, left)
            if isinstance(piece, Path):
                with open(piece, "rb") as f:
                    f.seek(skip)
                    want = take
                    while want > 0:
                        block = f.read(min(READ, want))
                        if not block:
                            raise IntegrityError(f"the store blob for {self.path} is shorter than its manifest says",
                                                 hint="run `mreg verify --all`")
                        want -= len(block)
                        yield block
            else:
                yield piece[skip:skip + take]
            left -= take
            at += n


def layer_digest(layer: TarLayer, advance: Progress | None = None) -> str:
    """The sha256 of a layer's bytes (one streaming pass)."""
    h = hashlib.sha256()
    for chunk in layer.chunks():
        h.update(chunk)
        if advance is not None:
            advance.advance(len(chunk))
    return f"sha256:{h.hexdigest()}"


def _cache_path(store_root: Path, blob_sha256: str, path: str) -> Path:
    key = hashlib.sha256(f"{TAR_VERSION}\0{blob_sha256}\0{path}".encode()).hexdigest()
    return layout.oci_image_cache(store_root, key)


def _cached(cache: Path, size: int) -> str | None:
    try:
        doc = json.loads(cache.read_bytes())
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("digest"), str) and DIGEST.match(doc["digest"]) \
        and doc.get("size") == size
    return str(doc["digest"]) if ok else None


def image_layers(store_root: Path, m: Manifest, manifest_raw: bytes) -> list[tuple[TarLayer, str, str | None]]:
    """The layers of a version's image, with the path in the version and the format they belong to (pure)."""
    out: list[tuple[TarLayer, str, str | None]] = []
    for art in m.artifacts:
        for f in art.files:
            path = f"{ROOT}/{m.name}/{art.path}/{f.path}"
            out.append((TarLayer(path, tar_header(path, f.size), f.size, file=layout.blob_path(store_root, f.sha256)),
                        f.sha256, art.format))
    path = f"{ROOT}/{m.name}/{layout.MANIFEST}"
    out.append((TarLayer(path, tar_header(path, len(manifest_raw)), len(manifest_raw), data=manifest_raw),
                "", None))
    return out


def pack_image(store_root: Path, m: Manifest, manifest_raw: bytes, progress: Progress | None = None,
               base: BaseImage | None = None) -> Packed:
    """The image of a version (over a base image's layers, when given): its layers' digests (cached per file and
    path), the config, the manifest."""
    progress = progress or NoProgress()
    layers = image_layers(store_root, m, manifest_raw)
    caches = {layer.path: _cache_path(store_root, sha, layer.path) for layer, sha, _ in layers if sha}
    known = {layer.path: d for layer, _, _ in layers
             if layer.path in caches and (d := _cached(caches[layer.path], layer.size)) is not None}
    todo = [layer for layer, _, _ in layers if layer.path not in known]
    if any(layer.file is not None for layer in todo):
        progress.start(f"hashing image layers of {m.name}@{m.version}", sum(t.size for t in todo))
    for layer in todo:
        known[layer.path] = layer_digest(layer, progress if layer.file is not None else None)
        if layer.path in caches:
            cache = caches[layer.path]
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(cache, json.dumps({"digest": known[layer.path], "size": layer.size}).encode())
    if any(layer.file is not None for layer in todo):
        progress.done()
    blobs = [(Blob(known[layer.path], layer.size, media.TAR_LAYER, source=layer),
              {media.MREG_PATH: layer.path, **({media.MREG_FORMAT: fmt} if fmt else {})})
             for layer, _, fmt in layers]
    config_raw = canonical(image_config(m, manifest_raw, [b.digest for b, _ in blobs], base))
    config = Blob(digest_of(config_raw), len(config_raw), media.IMAGE_CONFIG, config_raw)
    created = m.created.at.isoformat().replace("+00:00", "Z")
    notes = {media.CREATED: created, media.MREG_NAME: m.name, media.MREG_VERSION: str(m.version)}
    if base is not None:
        # base.name is an image reference (`host/repo:tag`), which a layout or an archive has none of
        notes |= {media.BASE_DIGEST: base.digest, **({media.BASE_NAME: base.image_name} if base.image_name else {})}
    below = list(base.layers) if base is not None else []
    doc = {
        "schemaVersion": 2,
        "mediaType": media.OCI_MANIFEST,
        "config": descriptor(config),
        "layers": [descriptor(b) for b in below] + [descriptor(b, a) for b, a in blobs],
        "annotations": notes,
    }
    raw = canonical(doc)
    unique = {b.digest: b for b in [config, *below, *(b for b, _ in blobs)]}
    return Packed(tuple(unique.values()), raw, digest_of(raw))


def image_config(m: Manifest, manifest_raw: bytes, diff_ids: list[str], base: BaseImage | None = None
                 ) -> dict[str, Any]:
    """The image config (pure): platform, labels naming the version, no command, diff ids = layer digests; over a
    base, the base's config (platform, Env, Cmd, …) with the labels added and the diff ids and history extended."""
    created = m.created.at.isoformat().replace("+00:00", "Z")
    labels = {media.MREG_NAME: m.name, media.MREG_VERSION: str(m.version),
              media.MREG_MANIFEST_DIGEST: digest_of(manifest_raw), media.VERSION: str(m.version),
              media.CREATED: created}
    if base is None:
        return {**PLATFORM, "created": created,
                "config": {"Labels": labels, "WorkingDir": f"/{ROOT}/{m.name}"},
                "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    cfg = dict(base.config)
    inner = dict(cfg.get("config") or {}) if isinstance(cfg.get("config"), dict) else {}
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    cfg |= {"created": created, "config": inner,
            "rootfs": {"type": "layers", "diff_ids": [*cfg["rootfs"]["diff_ids"], *diff_ids]}}
    if isinstance(cfg.get("history"), list):
        cfg["history"] = [*cfg["history"], *({"created": created, "created_by": "mreg push --as-image"}
                                             for _ in diff_ids)]
    return cfg
