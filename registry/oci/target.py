"""What push and pull need from where artifacts live: a registry over HTTP or an OCI image layout on disk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: A manifest is small; anything larger than this is refused before it is parsed.
MAX_MANIFEST = 4 << 20


@dataclass(frozen=True)
class FetchedManifest:
    """A manifest's exact bytes, its media type and its digest (computed here, never taken on trust)."""

    data: bytes
    media_type: str
    digest: str


class Target(Protocol):
    """A content-addressed place for blobs and manifests, with tags."""

    location: str

    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the target has (`sha256:…`), or None."""

    def upload_blob(self, digest: str, size: int, path: Path, advance: Callable[[int], None]) -> None:
        """Send a file as the blob `digest`; the target refuses it if its bytes do not match."""

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
