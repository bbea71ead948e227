"""What push and pull need from where artifacts live: a registry over HTTP or an OCI image layout on disk."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: A manifest is small; anything larger than this is refused before it is parsed.
MAX_MANIFEST = 4 << 20


def read_capped(chunks: Iterable[bytes], what: str, hint: str, limit: int = MAX_MANIFEST) -> bytes:
    """A small document's bytes (a manifest, a config, a referrers page), refused once it passes `limit`:
    IntegrityError("{what} is over {limit} bytes")."""
    from registry.errors import IntegrityError

    parts: list[bytes] = []
    size = 0
    for block in chunks:
        parts.append(block)
        size += len(block)
        if size > limit:
            raise IntegrityError(f"{what} is over {limit} bytes", hint=hint)
    return b"".join(parts)


@dataclass(frozen=True)
class FetchedManifest:
    """A manifest's exact bytes, its media type and its digest (computed here, never taken on trust)."""

    data: bytes
    media_type: str
    digest: str


class BlobSource(Protocol):
    """Bytes made on the fly rather than read from one file (an image's tar layer), re-readable from any offset."""

    @property
    def size(self) -> int:
        """How many bytes the source makes."""

    def chunks(self, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The bytes from `start`, `length` of them (to the end when None)."""


#: What a blob is sent from: a file, or a source that makes its bytes.
BlobBody = Path | BlobSource


class Target(Protocol):
    """A content-addressed place for blobs and manifests, with tags."""

    location: str

    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the target has (`sha256:…`), or None."""

    def upload_blob(self, digest: str, size: int, path: BlobBody, advance: Callable[[int], None]) -> int:
        """Send a file (or a source's bytes) as the blob `digest` (the target refuses it if its bytes do not
        match); returns the bytes not sent again because an interrupted upload of it was resumed."""

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """A blob's bytes, streamed (the caller verifies them)."""

    def get_manifest(self, reference: str) -> FetchedManifest | None:
        """The manifest a tag or digest names, or None."""

    def put_manifest(self, data: bytes, media_type: str, tag: str) -> None:
        """Store a manifest and point the tag at it (the last write of a push)."""

    def referrers(self, subject: str) -> list[dict[str, Any]]:
        """Descriptors of the manifests whose `subject` is this digest, as the target lists them (unchecked)."""

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> None:
        """Store a manifest whose subject is `subject` and list it among that digest's referrers (once)."""
