"""An OCI image layout carried as one tar file (`oci-archive:FILE.tar[:TAG]`): what `skopeo copy
oci-archive:FILE.tar:TAG docker://…` reads and `skopeo copy … oci-archive:FILE.tar:TAG` writes.

Members (the names of `registry.layout`'s OCI image layout)::

    oci-layout                 {"imageLayoutVersion": "1.0.0"}          first
    blobs/sha256/<hex>         configs, layers, manifests               streamed in, hashed while written
    index.json                 tags (org.opencontainers.image.ref.name)  last: a cut archive has none

Reading never extracts: the member headers are read once (tarfile, seeking over the data), and
each is checked before anything is used: a regular file or a directory, a relative path with no
`..`, its data inside the file (a truncated archive is refused), no name twice. A blob is read
by seeking to its data; the index's manifest must hash to its digest and every blob it names must
be a member, so a damaged archive is refused (exit 4) before any layer is fetched.

Writing: a new tar at a temporary name beside FILE (`.FILE.archive-HOST-PID-…`, swept when its
writer is gone), fsynced, then renamed over FILE: a killed push leaves FILE as it was. Pushing
to an existing archive rewrites it: its blobs are copied over (each checked against its name),
the new ones added, and the tag moved as in a layout; one writer at a time (the last rename wins).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from registry import atomic, layout
from registry.digest import file_chunks
from registry.errors import IntegrityError, NotFound, UsageError
from registry.oci import media, referrers
from registry.oci.image import BLOCK, tar_entry
from registry.oci.layout import index_referrers, retag, select_entry, with_referrer
from registry.oci.reference import DIGEST, ArchiveRef
from registry.oci.target import MAX_MANIFEST, BlobBody, FetchedManifest

READ = 1 << 20
#: More members than this is not an archive mreg or skopeo wrote.
MAX_MEMBERS = 1_000_000
LAYOUT_DOC = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()


def _blob_name(digest: str) -> str:
    return f"{layout.BLOBS}/{digest.replace(':', '/', 1)}"


class ArchiveTarget:
    """An OCI archive file: read in place, or rewritten whole (at a temporary name, then renamed) by a push."""

    def __init__(self, ref: ArchiveRef, *, create: bool = False) -> None:
        self.path = ref.path
        self.location = str(ref.path)
        #: member name → (offset of its data, size), from the archive as it was opened
        self._members: dict[str, tuple[int, int]] = {}
        self._index_doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": []}
        self._out: IO[bytes] | None = None
        self._tmp: Path | None = None
        self._written: dict[str, int] = {}
        if self.path.exists():
            if not self.path.is_file():
                raise UsageError(f"{self.path} is not a file", hint="name a .tar file (oci-archive:FILE.tar[:TAG])")
            self._read_members()
        elif not create:
            raise NotFound(f"{self.path} does not exist",
                           hint="give a file written by `mreg push … oci-archive:FILE.tar` or `skopeo copy … "
                                "oci-archive:FILE.tar`")

    def _hostile(self, why: str) -> IntegrityError:
        return IntegrityError(f"{self.location}: {why}",
                              hint="this archive is damaged or was not written as an OCI layout; nothing was written")

    # -- reading ------------------------------------------------------------------------------------

    def _read_members(self) -> None:
        size = self.path.stat().st_size
        try:
            with tarfile.open(self.path, "r:") as tf:
                for n, m in enumerate(tf):
                    if n > MAX_MEMBERS:
                        raise self._hostile(f"more than {MAX_MEMBERS} members")
                    self._check_member(m, size)
        except (tarfile.TarError, EOFError) as e:
            raise self._hostile(f"not a readable tar archive ({type(e).__name__}: {str(e)[:80]})") from None
        for need in (layout.OCI_LAYOUT_FILE, layout.OCI_INDEX_FILE):
            if need not in self._members:
                raise self._hostile(f"no {need} member (not an OCI archive, or cut short)")
        data = self._small(layout.OCI_INDEX_FILE, MAX_MANIFEST)
        try:
            doc = json.loads(data)
        except ValueError:
            raise self._hostile("index.json is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests", []), list):
            raise self._hostile("index.json is not an OCI index")
        self._index_doc = doc

    def _check_member(self, m: tarfile.TarInfo, size: int) -> None:
        name = m.name
        while name.startswith("./"):
            name = name[2:]
        name = name.rstrip("/")
        if name in ("", "."):
            return
        parts = name.split("/")
        if m.name.startswith("/") or ".." in parts or "" in parts or "\\" in name:
            raise self._hostile(f"member {m.name[:80]!r} is not a plain relative path")
        if m.isdir():
            return
        if m.issym() or m.islnk():
            raise self._hostile(f"member {name[:80]!r} is a link")
        if not m.isreg() or m.issparse():
            raise self._hostile(f"member {name[:80]!r} is not a regular file")
        if m.offset_data + m.size > size:
            raise self._hostile(f"member {name[:80]!r} is cut short: the archive is truncated")
        if name in self._members:
            raise self._hostile(f"member {name[:80]!r} appears twice")
        self._members[name] = (m.offset_data, m.size)

    def _range(self, name: str) -> Iterator[bytes]:
        offset, left = self._members[name]
        with open(self.path, "rb") as f:
            f.seek(offset)
            while left > 0:
                block = f.read(min(READ, left))
                if not block:
                    raise self._hostile(f"member {name[:80]!r} is cut short: the archive is truncated")
                left -= len(block)
                yield block

    def _small(self, name: str, limit: int) -> bytes:
        if self._members[name][1] > limit:
            raise self._hostile(f"{name} is over {limit} bytes")
        return b"".join(self._range(name))

    def _name(self, digest: str) -> str:
        if not DIGEST.match(digest):
            raise self._hostile(f"{digest[:80]!r} is not a sha256 digest")
        return _blob_name(digest)

    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the archive has (or this push has added), or None."""
        if digest in self._written:
            return self._written[digest]
        member = self._members.get(self._name(digest))
        return member[1] if member else None

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """A blob's bytes, read in place (the caller verifies them)."""
        name = self._name(digest)
        if name not in self._members:
            raise self._hostile(f"no blob {digest[:19]}… although a manifest names it")
        return self._range(name)

    def get_manifest(self, reference: str) -> FetchedManifest | None:
        """The manifest the index names (by tag, digest, or the only one), checked with every blob it names."""
        entry = select_entry(self.location, self._index_doc, reference)
        if entry is None:
            return None
        digest = str(entry.get("digest"))
        name = self._name(digest)
        if name not in self._members:
            raise self._hostile(f"the index names manifest {digest[:19]}…, which is absent")
        data = self._small(name, MAX_MANIFEST)
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise self._hostile(f"the manifest {digest[:19]}… does not match its digest")
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None  # read_artifact says what is wrong with it
        if isinstance(doc, dict):
            named = [doc.get("config"), *(doc.get("layers") or [])] if isinstance(doc.get("layers"), list) else []
            for d in named:
                if isinstance(d, dict) and isinstance(d.get("digest"), str):
                    member = self._members.get(self._name(d["digest"]))
                    if member is None:
                        raise self._hostile(f"the manifest names blob {d['digest'][:19]}…, which is absent")
                    if member[1] != d.get("size"):
                        raise self._hostile(f"blob {d['digest'][:19]}… is {member[1]} bytes, not {d.get('size')}")
        return FetchedManifest(data, str(entry.get("mediaType", media.OCI_MANIFEST)), digest)

    # -- writing ------------------------------------------------------------------------------------

    def _begin(self) -> IO[bytes]:
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic.sweep(self.path.parent, "archive")
            self._tmp = atomic.temp_name(self.path, "archive")
            self._out = open(self._tmp, "xb")  # noqa: SIM115 (kept open across calls; closed by put_manifest/close)
            self._add(layout.OCI_LAYOUT_FILE, len(LAYOUT_DOC), [LAYOUT_DOC])
        return self._out

    def _add(self, name: str, size: int, chunks: Iterable[bytes],
             advance: Callable[[int], None] | None = None) -> str:
        """Append one member, hashed while written; returns the sha256 of its bytes."""
        out = self._begin()
        h, n = hashlib.sha256(), 0
        try:
            out.write(tar_entry(name, size=size))
            for chunk in chunks:
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
                if advance is not None:
                    advance(len(chunk))
            out.write(b"\0" * (-size % BLOCK))
        except OSError as e:
            atomic.raise_if_full(e, self.path.parent)
            raise
        if n != size:
            raise IntegrityError(f"{name} is {n} bytes, not {size}", hint="run `mreg verify --all`")
        return h.hexdigest()

    def upload_blob(self, digest: str, size: int, path: BlobBody, advance: Callable[[int], None]) -> int:
        """Append a blob, hashed while written; a mismatch abandons the whole new archive (nothing resumes: 0)."""
        chunks = file_chunks(path) if isinstance(path, Path) else path.chunks()
        actual = self._add(self._name(digest), size, chunks, advance)
        if f"sha256:{actual}" != digest:
            raise IntegrityError(f"the bytes for blob {digest[:19]}… hash to sha256:{actual[:12]}…",
                                 hint="run `mreg verify --all`: the local blob may be damaged")
        self._written[digest] = size
        return 0

    def put_manifest(self, data: bytes, media_type: str, tag: str) -> None:
        """Carry the old archive's blobs over, add the manifest and the retagged index, then rename over FILE."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._finish(data, lambda index: retag(index, digest, media_type, len(data), tag))

    def referrers(self, subject: str) -> list[dict[str, Any]]:
        """The referrers of `subject` the archive's index lists (as in a layout)."""
        def read(digest: str) -> bytes | None:
            name = self._name(digest)
            return self._small(name, MAX_MANIFEST) if name in self._members else None

        return index_referrers(self._index_doc, subject, self.get_manifest, read)

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> None:
        """List a referrer in the index, untagged (once): the archive is rewritten as by a push (each signature
        costs a copy of the archive; signatures are few)."""
        entry = referrers.descriptor(data, media_type)
        if with_referrer(self._index_doc, entry) is None:
            return
        self._finish(data, lambda index: with_referrer(index, entry) or index)

    def _finish(self, data: bytes, reindex: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Carry the old archive's blobs over, add `data` (a manifest) and the index `reindex` makes, then rename
        the new file over FILE."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._begin()
        prefix = f"{layout.BLOBS}/sha256/"
        for name, (_, size) in self._members.items():
            old = "sha256:" + name[len(prefix):]
            if not name.startswith(prefix) or not DIGEST.match(old) or old in self._written:
                continue
            if self._add(name, size, self._range(name)) != old.split(":", 1)[1]:
                raise self._hostile(f"its blob {old[:19]}… does not match its name; remove the file or push to "
                                    "another one")
            self._written[old] = size
        if digest not in self._written:
            self._add(self._name(digest), len(data), [data])
            self._written[digest] = len(data)
        index = json.dumps(reindex(self._index_doc), indent=2).encode()
        self._add(layout.OCI_INDEX_FILE, len(index), [index])
        assert self._out is not None and self._tmp is not None
        try:
            self._out.write(b"\0" * (2 * BLOCK))
            self._out.flush()
            os.fsync(self._out.fileno())
        except OSError as e:
            atomic.raise_if_full(e, self.path.parent)
            raise
        self._out.close()
        self._out = None
        os.replace(self._tmp, self.path)
        self._tmp = None
        atomic.fsync_dir(self.path.parent)
        self._members, self._written = {}, {}
        self._read_members()  # the offsets are the new file's from now on

    def close(self) -> None:
        """Abandon an archive left unfinished (a failed push): FILE stays as it was."""
        if self._out is not None:
            self._out.close()
            self._out = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
