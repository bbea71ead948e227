"""Where a version goes or comes from: `oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]`, `oci-layout:DIR[:TAG]` or
`oci-archive:FILE.tar[:TAG]`."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from registry.errors import UsageError

SCHEME = "oci://"
LAYOUT_SCHEME = "oci-layout:"
ARCHIVE_SCHEME = "oci-archive:"
_HOST = re.compile(r"\A(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?\Z")
_REPO = re.compile(r"\A[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z")
TAG = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
DIGEST = re.compile(r"\Asha256:[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class OciRef:
    """A repository in a registry, and a tag or digest in it (either may be absent: a push picks a tag)."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str | None:
        """What the manifests endpoint takes: the digest when given, else the tag."""
        return self.digest or self.tag

    @property
    def is_loopback(self) -> bool:
        """Whether the registry is on this machine (where --insecure, plain HTTP, is allowed)."""
        name = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else self.host[1:self.host.index("]")]
        if name == "localhost":
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    @property
    def image_name(self) -> str:
        """The plain image reference (`host/repo:tag` or `host/repo@digest`, no scheme): what other tools name."""
        at = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"{self.host}/{self.repository}{at}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.image_name}"


@dataclass(frozen=True)
class LayoutRef:
    """An OCI image layout directory and a tag (`org.opencontainers.image.ref.name`) or digest in it."""

    path: Path
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        at = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"{LAYOUT_SCHEME}{self.path}{at}"


@dataclass(frozen=True)
class ArchiveRef(LayoutRef):
    """An OCI image layout carried as one tar file (what `skopeo copy … oci-archive:FILE.tar:TAG` writes)."""

    def __str__(self) -> str:
        at = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"{ARCHIVE_SCHEME}{self.path}{at}"


def is_oci(text: str) -> bool:
    """Whether a location names an OCI registry, layout or archive rather than a store or hub repository."""
    return text.startswith((SCHEME, LAYOUT_SCHEME, ARCHIVE_SCHEME))


def _bad(text: str, why: str) -> UsageError:
    return UsageError(f"bad OCI reference {text!r}: {why}",
                      hint="use oci://HOST[:PORT]/REPO[:TAG|@sha256:DIGEST], oci-layout:DIR[:TAG] or "
                           "oci-archive:FILE.tar[:TAG]")


def parse(text: str) -> OciRef | LayoutRef:
    """Parse a registry or layout reference, refusing anything the distribution spec does not allow."""
    if text.startswith(LAYOUT_SCHEME):
        return _parse_layout(text, LAYOUT_SCHEME)
    if text.startswith(ARCHIVE_SCHEME):
        ref = _parse_layout(text, ARCHIVE_SCHEME)
        return ArchiveRef(ref.path, ref.tag, ref.digest)
    if not text.startswith(SCHEME):
        raise _bad(text, "it starts with none of oci://, oci-layout: and oci-archive:")
    rest = text[len(SCHEME):]
    host, _, path = rest.partition("/")
    if not _HOST.match(host):
        raise _bad(text, f"{host!r} is not a registry host[:port]")
    digest = tag = None
    if "@" in path:
        path, digest = path.split("@", 1)
        if not DIGEST.match(digest):
            raise _bad(text, "a digest is sha256: and 64 lowercase hex digits")
    elif ":" in path.rsplit("/", 1)[-1]:
        path, tag = path.rsplit(":", 1)
        if not TAG.match(tag):
            raise _bad(text, f"{tag!r} is not a valid tag")
    if not _REPO.match(path):
        raise _bad(text, f"{path!r} is not a repository name (lowercase letters, digits, '.', '_', '-', '/')")
    return OciRef(host, path, tag, digest)


def _parse_layout(text: str, scheme: str) -> LayoutRef:
    rest = text[len(scheme):]
    if rest.startswith("//"):
        rest = rest[2:]
    digest = tag = None
    if "@" in rest and DIGEST.match(rest.rsplit("@", 1)[1]):
        rest, digest = rest.rsplit("@", 1)
    else:
        head, sep, last = rest.rpartition(":")
        if sep and "/" not in last and TAG.match(last) and head:
            rest, tag = head, last
    if not rest:
        raise _bad(text, "no directory" if scheme == LAYOUT_SCHEME else "no file")
    return LayoutRef(Path(rest).expanduser(), tag, digest)
