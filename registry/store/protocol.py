"""The store protocol: what promotion, listing, verification and gc need from a store, local or S3.

Both backends (`registry.store.local.LocalStore`, `registry.store.s3.S3Store`) are checked
against `Store` by mypy; nothing outside this package asks which one it has.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from manifests import CheckRecord, HistoryEntry, Manifest, RolloutRecord, SignatureRecord
from registry.errors import IntegrityError, ModelNotFound, UsageError, VersionNotFound
from registry.refs import LATEST, Ref


@dataclass(frozen=True)
class Version:
    """A published version as read back from the store."""

    name: str
    number: int
    manifest: Manifest
    manifest_sha256: str
    path: str


class Store(Protocol):
    """What promotion, listing and verification need from a store, local or remote."""

    location: str
    #: Called with (model name, entry) after each history entry is committed (alias-change events); a listener's
    #: failure is its own: it never undoes or blocks the change.
    listeners: list[Listener]

    def models(self) -> list[str]:
        """Names of the models in the store."""

    def versions(self, name: str) -> list[int]:
        """Published version numbers of a model, ascending."""

    def survey(self, name: str) -> tuple[list[int], list[IntegrityError]]:
        """The published versions a reader can go on with, and the entries of the model that are not what mreg
        writes (named, not raised): `list` and `verify --all` report them beside the good versions."""

    def version(self, name: str, number: int) -> Version:
        """One published version."""

    def resolve(self, ref: Ref) -> Version:
        """The version a reference names."""

    def has_model(self, name: str) -> bool:
        """Whether the store knows this model."""

    def aliases(self, name: str) -> dict[str, int]:
        """Every alias of a model and the version it points to."""

    def alias(self, name: str, alias: str) -> int | None:
        """The version an alias points to, if it exists."""

    def history(self, name: str) -> list[HistoryEntry]:
        """Every recorded alias change of a model, oldest first."""

    def last_entry(self, name: str, alias: str) -> HistoryEntry | None:
        """The newest history entry of one alias."""

    def transact_alias(self, name: str, alias: str, decide: AliasDecision) -> tuple[int | None, HistoryEntry | None]:
        """Read an alias, let `decide` choose the change (or None), apply it atomically; returns (before, entry)."""

    def rollout(self, name: str, alias: str) -> RolloutRecord | None:
        """The staged rollout of an alias (running, paused, or the last one that ended), if any."""

    def transact_rollout(self, name: str, alias: str, decide: RolloutDecision
                         ) -> tuple[int | None, RolloutRecord | None, RolloutChange | None]:
        """Read the alias and its rollout record, let `decide` choose the change, write it by compare-and-swap (the
        record, the alias when the entry moves it, the entry); returns (alias before, record before, change)."""

    def point_alias(self, name: str, alias: str, number: int) -> None:
        """Point a derived alias (a rollout's canary) at a version; its history is the main alias's."""

    def drop_alias(self, name: str, alias: str) -> None:
        """Remove a derived alias (absent is fine)."""

    def keep_undelivered(self, record: dict[str, object]) -> str:
        """Keep an alias-change event that a URL did not take (for a resend); returns where it was kept."""

    def is_store(self) -> bool:
        """Whether there is a store at this location (a local directory that exists; S3: always, errors say)."""

    def find_by_key(self, name: str, key: str) -> Version | None:
        """The version made by the conversion with this key, if one was published."""

    def alias_mount(self, name: str, alias: str) -> str | None:
        """The path that follows an alias (what an engine mounts), where the store is a filesystem; else None."""

    def files_dir(self, version: Version) -> Path | None:
        """The version's directory when its files are on this machine; None for a remote store."""

    def check_records(self, name: str, number: int) -> list[CheckRecord] | None:
        """Golden-check records of a version, oldest first; None where this store keeps none."""

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Signature records of a version, oldest first (what they prove is judged against a trust policy)."""


@dataclass(frozen=True)
class RolloutChange:
    """A rollout record to write, and the history entry recording it (None: bookkeeping only, e.g. `applied`)."""

    record: RolloutRecord
    entry: HistoryEntry | None


HistoryLoader = Callable[[], list[HistoryEntry]]
Listener = Callable[[str, HistoryEntry], None]


def tell(listeners: list[Listener], name: str, entry: HistoryEntry) -> None:
    """Hand a committed entry to every listener; whatever a listener raises stays with it."""
    for listener in listeners:
        with contextlib.suppress(Exception):  # a listener must never turn a committed change into a failure
            listener(name, entry)


#: Given the alias's current target and a loader of the model's history, the entry to apply (or None).
AliasDecision = Callable[[int | None, HistoryLoader], HistoryEntry | None]
#: Given the alias's target, its rollout record and a loader of the history, the change to write (or None).
RolloutDecision = Callable[[int | None, RolloutRecord | None, HistoryLoader], RolloutChange | None]


def resolve_ref(store: Store, ref: Ref) -> Version:
    """The version a reference names in any store: number, alias, `latest` or manifest digest prefix.

    A digest prefix of digits only (about one ten-digit prefix in a hundred) reads as a version number first;
    when no such version exists it is matched as a digest prefix.
    """
    if ref.number is not None:
        try:
            return store.version(ref.name, ref.number)
        except VersionNotFound:
            if not ref.is_digest_prefix:
                raise
            return _by_digest(store, ref)
    if not store.has_model(ref.name):
        raise ModelNotFound(ref.name)
    if ref.ref == LATEST:
        numbers = store.versions(ref.name)
        if not numbers:
            raise VersionNotFound(ref.name, ref.ref)
        return store.version(ref.name, numbers[-1])
    target = store.alias(ref.name, ref.ref)
    if target is not None:
        return store.version(ref.name, target)
    if ref.is_digest_prefix:
        return _by_digest(store, ref)
    raise VersionNotFound(ref.name, ref.ref)


def _by_digest(store: Store, ref: Ref) -> Version:
    hits = [v for v in (store.version(ref.name, n) for n in store.versions(ref.name))
            if v.manifest_sha256.startswith(ref.ref)]
    if len(hits) > 1:
        raise UsageError(
            f"{ref} is ambiguous: it matches versions {', '.join(str(h.number) for h in hits)}",
            hint="give more digits of the manifest digest",
        )
    if hits:
        return hits[0]
    raise VersionNotFound(ref.name, ref.ref)


def read_manifest(data: bytes, name: str, number: int, where: str, *, hint: str) -> Manifest:
    """The manifest read from `name`'s version `number` (at `where`, a path or a URL), once it parses and says it
    is that version: the one check every store's reader makes.

    A manifest names the directory a sync writes, the number it publishes and what a push sends under that
    name: one that disagrees with its place would land in another model, or leave an alias dangling.
    """
    try:
        manifest = Manifest.model_validate_json(data)
    except ValueError as e:
        raise IntegrityError(f"{name}@{number}: manifest {where} does not parse: {str(e).splitlines()[0]}",
                             hint=hint) from None
    if (manifest.name, manifest.version) != (name, number):
        raise IntegrityError(f"{where} says it is {manifest.name}@{manifest.version}, not {name}@{number}",
                             hint=hint)
    return manifest


def first_of(strays: list[IntegrityError]) -> IntegrityError:
    """One error line for every stray entry found: the first, and how many more (all of them in its details)."""
    if len(strays) == 1:
        return strays[0]
    more = len(strays) - 1
    return IntegrityError(f"{strays[0]} (and {more} more {'entry' if more == 1 else 'entries'} mreg did not write)",
                          hint=strays[0].hint, details={"entries": [str(e) for e in strays]})


def manifest_bytes(manifest: Manifest) -> bytes:
    """The exact bytes of a manifest file (its sha256 is the manifest digest)."""
    return (manifest.model_dump_json(by_alias=True, indent=2) + "\n").encode()


def manifest_json(manifest: Manifest) -> dict[str, object]:
    """The manifest as a JSON-ready dict."""
    result: dict[str, object] = json.loads(manifest_bytes(manifest))
    return result
