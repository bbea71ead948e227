"""A SOURCE as `mreg pull` and `mreg convert` take it, read once into what it names, which pulls itself.

`ORG/NAME[@REV]` is a hub repository, `./DIR`, `/DIR` or `file:///DIR` a local directory, `oci://…`,
`oci-layout:…` or `oci-archive:…` an OCI artifact (`registry.oci.reference.is_oci` decides, here and
nowhere else for a source), and `NAME[@REF]` may name a version of the store (`model`: the store
decides). Each kind knows how to bring itself into the cache (`pull`) and what it can tell before that
(`config`: a hub repository's config.json, fetched alone, so that a converter refuses a model before its
weights are downloaded). A hub source is listed once: its config and its weights come from one listing,
of one commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.errors import UsageError
from registry.refs import is_name

if TYPE_CHECKING:
    from registry.cache import Snapshot
    from registry.cache.hub import Hub
    from registry.oci.reference import LayoutRef, OciRef
    from registry.progress import Progress


@dataclass(frozen=True)
class Fetch:
    """How a source is brought into the cache."""

    cache: Path
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    allow_pickle: bool = False
    offline: bool = False
    endpoint: str | None = None
    #: Plain HTTP to a loopback OCI registry.
    insecure: bool = False
    #: A local directory is copied into the cache rather than linked in place.
    copy: bool = False


@dataclass
class HubSource:
    """A hub repository at a revision (`main` when none is given)."""

    text: str
    repo: str
    revision: str | None
    fetch: Fetch
    _hub: Hub | None = field(default=None, repr=False)

    @property
    def model(self) -> str | None:
        """The store's model it may name as `NAME[@REF]` (a repository id has a slash, a store's name none)."""
        return self.repo if "/" not in self.repo and ":" not in self.repo and is_name(self.repo) else None

    def hub(self) -> Hub:
        """The repository on its hub, listed at most once."""
        from registry.cache.hub import Hub

        if self._hub is None:
            self._hub = Hub(self.fetch.cache, self.repo, self.revision, endpoint=self.fetch.endpoint,
                            offline=self.fetch.offline)
        return self._hub

    def config(self) -> dict[str, Any] | None:
        """config.json fetched alone and read (None: absent or damaged, which the full pull and the converters
        report); the weights then come from the same commit, of the same listing."""
        from registry.convert.configs import read_config

        snap = self.hub().pull(include=["config.json"])
        self._hub = self.hub().at(snap.record.source.commit)
        return read_config(snap.path / "config.json")

    def pull(self, progress: Progress | None = None) -> Snapshot:
        """The repository's selected files into the cache, every one verified."""
        f = self.fetch
        return self.hub().pull(include=f.include, exclude=f.exclude, allow_pickle=f.allow_pickle, progress=progress)


@dataclass(frozen=True)
class LocalSource:
    """A directory on this machine: hashed and linked in place (or copied into the cache)."""

    text: str
    path: Path
    fetch: Fetch
    model = None

    def config(self) -> None:
        """Nothing is downloaded: the conversion refuses before it writes."""

    def pull(self, progress: Progress | None = None) -> Snapshot:
        """The directory into the cache (the hub's options do not apply)."""
        from registry.cache import pull_local

        f = self.fetch
        return pull_local(f.cache, self.path, include=f.include, exclude=f.exclude, allow_pickle=f.allow_pickle,
                          copy=f.copy, progress=progress)


@dataclass(frozen=True)
class OciSource:
    """An artifact in an OCI registry, layout or archive."""

    text: str
    ref: OciRef | LayoutRef
    fetch: Fetch
    model = None

    def config(self) -> None:
        """Its layers come in one pull: the conversion refuses before it writes."""

    def pull(self, progress: Progress | None = None) -> Snapshot:
        """The artifact's file layers into the cache as a pinned snapshot, every layer verified."""
        from registry.oci import transfer

        f = self.fetch
        if f.offline:
            raise UsageError("--offline cannot pull from an OCI registry", hint="pull once online; then convert "
                             "from the cached version with NAME@REF")
        target = transfer.open_target(self.ref, insecure=f.insecure)
        return transfer.pull(f.cache, self.ref, target, include=f.include, exclude=f.exclude,
                             allow_pickle=f.allow_pickle, progress=progress)


Source = HubSource | LocalSource | OciSource


def parse(text: str, fetch: Fetch) -> Source:
    """What a SOURCE names, decided once."""
    from registry.cache import local_source
    from registry.oci import reference

    if reference.is_oci(text):
        return OciSource(text, reference.parse(text), fetch)
    directory = local_source(text)
    if directory is not None:
        return LocalSource(text, directory, fetch)
    repo, _, rev = text.partition("@")
    return HubSource(text, repo, rev or None, fetch)

