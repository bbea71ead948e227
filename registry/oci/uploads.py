"""Chunked OCI uploads a killed push can resume: one session file per blob being sent, under the store's tmp/.

Layout (names in `registry.layout`)::

    <store>/tmp/oci-uploads/<blob hex>-<target hash16>.json
        {"schema_version": 1, "target": "HOST/REPO", "digest": "sha256:…", "size": N,
         "location": "https://HOST/v2/REPO/blobs/uploads/<uuid>?_state=…", "confirmed": BYTES, "updated": "…"}
    <store>/tmp/oci-uploads/<blob hex>-<target hash16>.lock   held by the push sending that blob
    <store>/tmp/oci-uploads.lock      every push holds it shared while it runs

A session is written (atomically) after the registry opens the upload and again after every PATCH
it acknowledges, before the progress hears of the bytes, so a push killed between two chunks finds
exactly what the registry confirmed. The next push asks the registry (`GET` on the upload URL: 204
with `Range: 0-N`) and continues with PATCH from N+1; a session the registry no longer knows (404,
expired, or one whose state moved because a chunk was cut mid-way) is dropped and the blob starts
again. The file holds the upload URL the registry handed out (its own signed state) and never a
credential or an Authorization header; a URL whose origin is not the target's is never followed.

One push at a time owns a blob's session (the `.lock` beside it); a second push of the same blob to
the same repository meanwhile uploads on its own and records nothing, since two writers on one
distribution session make it cancel the upload.

Sessions go when their blob is complete, when a push of the same target succeeds, and in `mreg gc`,
which removes `tmp/oci-uploads/` like any other interrupted write once no push holds its lock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from registry import atomic, layout

#: Larger than this a session file is not ours.
MAX_SESSION = 64 << 10


class UploadSession(BaseModel):
    """A chunked upload in progress: where it is, what it sends, and how many bytes the registry confirmed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    target: str
    digest: str
    size: int
    location: str
    confirmed: int
    updated: str


class UploadSessions:
    """The sessions of one target (`HOST/REPO`) in one store's tmp/."""

    def __init__(self, directory: Path, target: str) -> None:
        self.directory = directory
        self.target = target
        self._suffix = hashlib.sha256(target.encode()).hexdigest()[:16]

    def _path(self, digest: str) -> Path:
        return layout.oci_upload_session(self.directory, digest.split(":", 1)[1], self._suffix)

    def load(self, digest: str, size: int) -> UploadSession | None:
        """The session of a blob, if one was saved for this target, digest and size (anything else is dropped)."""
        path = self._path(digest)
        try:
            if path.stat().st_size > MAX_SESSION:
                raise ValueError("too large")
            s = UploadSession.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, ValidationError):
            self.drop(digest)
            return None
        if s.target != self.target or s.digest != digest or s.size != size or not 0 <= s.confirmed <= size:
            self.drop(digest)
            return None
        return s

    def save(self, digest: str, size: int, location: str, confirmed: int) -> None:
        """Record where an upload stands (atomically: a reader sees the previous record or this one)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        s = UploadSession(target=self.target, digest=digest, size=size, location=location, confirmed=confirmed,
                          updated=now)
        atomic.write_bytes(self._path(digest), s.model_dump_json().encode())

    def drop(self, digest: str) -> None:
        """Forget a blob's session (done, or unknown to the registry)."""
        self._path(digest).unlink(missing_ok=True)

    @contextlib.contextmanager
    def claim(self, digest: str) -> Iterator[bool]:
        """Hold a blob's session for this process (an flock beside it); yields False when another push holds it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic.flock(layout.oci_upload_lock(self._path(digest)), blocking=False) as got:
            yield got

    def clear(self) -> None:
        """Forget every session of this target no push holds (a push of it succeeded: nothing is left to resume).
        The `.lock` files stay (unlinking one would race its next holder); gc removes the directory."""
        if self.directory.is_dir():
            for p in self.directory.glob(layout.oci_upload_session(self.directory, "*", self._suffix).name):
                with atomic.flock(layout.oci_upload_lock(p), blocking=False) as got:
                    if got:
                        p.unlink(missing_ok=True)


@contextlib.contextmanager
def pushing(root: Path) -> Iterator[None]:
    """Held by a push while it runs, so gc leaves its sessions alone (gc takes the lock exclusively)."""
    with atomic.flock(layout.oci_uploads_lock(root), shared=True):
        yield
