"""mreg's Python API as one object: `Registry(store, cache)` runs the loop the `mreg` commands run.

A pipeline (Airflow, Dagster, Kubeflow) opens its store and cache once and calls methods: pull,
convert, promote, rollback, resolve; list, show, history; mount checks and Triton views of a local
store; push and sync to and from an S3 store. Each method is the `registry.api` function of the
same name with the store and cache filled in: it returns a typed result (every type in `__all__`,
importable from here), never prints, never exits, and raises `MregError` subclasses that carry a
`hint` and an `exit_code`. Nothing of the process is changed: no logging set-up, no stdout.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from manifests import HistoryEntry
from registry import api
from registry.api import ModelSummary, Resolved, StoreListing, VersionDetails, VersionListing
from registry.cache.records import Snapshot
from registry.convert.execute import ConversionOutcome
from registry.convert.plan import AnyTarget
from registry.errors import MregError, UsageError
from registry.progress import Progress
from registry.release.aliases import AliasChange
from registry.release.hooks import HookedPromotion
from registry.serving.mount import MountReport
from registry.serving.triton import TritonExport
from registry.store.gc import GCPlan
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.s3 import S3Store
from registry.store.transfer import PushOutcome, SyncOutcome
from registry.store.trust import TrustPolicy
from registry.store.verify import VerifyReport

__all__ = [
    "AliasChange",
    "ConversionOutcome",
    "GCPlan",
    "HistoryEntry",
    "HookedPromotion",
    "LocalStore",
    "ModelSummary",
    "MountReport",
    "MregError",
    "PushOutcome",
    "Registry",
    "Resolved",
    "S3Store",
    "Snapshot",
    "StoreListing",
    "SyncOutcome",
    "TritonExport",
    "TrustPolicy",
    "VerifyReport",
    "Version",
    "VersionDetails",
    "VersionListing",
]


class Registry:
    """A store (a directory or `s3://bucket/prefix`) and the cache its conversions pull into."""

    def __init__(self, store: str | Path | LocalStore | S3Store, cache: str | Path | None = None, *,
                 endpoint_url: str | None = None) -> None:
        """Open `store` (S3: at `endpoint_url`, else $AWS_ENDPOINT_URL); `cache` is needed by pull and convert."""
        self.store = store if isinstance(store, (LocalStore, S3Store)) else \
            api.open_store(store, endpoint_url=endpoint_url)
        self.cache = Path(cache) if cache is not None else None

    def __repr__(self) -> str:
        return f"Registry({self.store.location!r}, cache={str(self.cache) if self.cache else None!r})"

    def pull(self, source: str, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
             allow_pickle: bool = False, offline: bool = False, endpoint: str | None = None,
             progress: Progress | None = None) -> Snapshot:
        """Bring a source (`ORG/NAME[@REV]`, `./DIR`, `oci://…`) into the cache, every file verified."""
        return api.pull(source, cache=self._cache(), include=include, exclude=exclude, allow_pickle=allow_pickle,
                        offline=offline, endpoint=endpoint, progress=progress)

    def convert(self, source: str, targets: Sequence[AnyTarget], *, name: str | None = None,
                include: Sequence[str] = (), exclude: Sequence[str] = (), allow_pickle: bool = False,
                offline: bool = False, endpoint: str | None = None, progress: Progress | None = None,
                wait: bool = True) -> ConversionOutcome:
        """A new verified version of `name` from a source (pulled first), or the same conversion's version."""
        return api.convert(source, targets, store=self.store, cache=self._cache(), name=name, include=include,
                           exclude=exclude, allow_pickle=allow_pickle, offline=offline, endpoint=endpoint,
                           progress=progress, wait=wait)

    def promote(self, ref: str, *, alias: str = "production", expect: int | str | None = "",
                reason: str | None = None, require: Sequence[str] = (), force: bool = False,
                policy: dict[str, Any] | None = None, trust: TrustPolicy | None = None) -> HookedPromotion:
        """Point `alias` at the version `ref` names, after the gates (`expect`: None, the alias must not exist
        yet; "": no condition); `policy` is the config file's contents (its hooks and requirements apply)."""
        return api.promote(self.store, ref, alias=alias, expect=expect, reason=reason, require=require,
                           force=force, policy=policy, trust=trust)

    def rollback(self, name: str, *, alias: str = "production", to: int | None = None,
                 expect: int | str | None = "", reason: str | None = None, force: bool = False) -> AliasChange:
        """Move an alias back to where it pointed before (or to `to`)."""
        return api.rollback(self.store, name, alias=alias, to=to, expect=expect, reason=reason, force=force)

    def resolve(self, ref: str, *, fmt: str = "hf", physical: bool = False) -> Resolved:
        """The path an engine mounts for a version's artifact (an alias path follows promotions)."""
        return api.resolve(self.store, ref, fmt=fmt, physical=physical)

    def list_models(self) -> StoreListing:
        """Every model with its versions and aliases (`mreg list`)."""
        return api.list_models(self.store)

    def list_versions(self, name: str) -> VersionListing:
        """Every version of one model (`mreg list NAME`)."""
        return api.list_versions(self.store, name)

    def show(self, ref: str, *, trust: TrustPolicy | Callable[[str], TrustPolicy] | None = None
             ) -> VersionDetails:
        """A version, the aliases at it and its signatures judged against `trust` (`mreg show`)."""
        return api.show(self.store, ref, trust=trust)

    def history(self, name: str, *, alias: str | None = None) -> list[HistoryEntry]:
        """Every alias change of a model, oldest first (`mreg history`)."""
        return api.history(self.store, name, alias=alias)

    def aliases_at(self, name: str, at: str | dt.datetime, *, alias: str | None = None) -> dict[str, HistoryEntry]:
        """Which version each alias pointed to at `at` (`mreg history --at`)."""
        return api.aliases_at(self.store, name, at, alias=alias)

    def verify(self, refs: Sequence[str] = (), *, all_versions: bool = False) -> list[VerifyReport]:
        """Re-hash these versions (or every one): a report per version (`mreg verify`)."""
        return api.verify(self.store, refs, all_versions=all_versions)

    def gc(self, *, keep_history: int = 10, keep_latest: int = 3, grace_hours: float = 24.0,
           apply: bool = False) -> GCPlan:
        """What nothing needs any more, removed when `apply` (`mreg gc`)."""
        return api.gc(self.store, keep_history=keep_history, keep_latest=keep_latest, grace_hours=grace_hours,
                      apply=apply)

    def mount_check(self, name: str, *, alias: str = "production", mount_root: str | None = None,
                    verify: bool = False) -> MountReport:
        """Check an alias of a local store against the mount contract (`mreg mount-check`)."""
        return api.mount_check(self._local("mount_check"), name, alias=alias, mount_root=mount_root, verify=verify)

    def export_triton(self, ref: str, repo: str | Path, *, max_batch_size: int = 8,
                      prefer: str = "auto") -> TritonExport:
        """A Triton model repository entry for a version of a local store (`mreg export triton`)."""
        return api.export_triton(self._local("export_triton"), ref, repo, max_batch_size=max_batch_size,
                                 prefer=prefer)

    def push(self, ref: str, remote: str | S3Store, *, endpoint_url: str | None = None,
             progress: Progress | None = None, verify_remote: bool = False, force: bool = False,
             insecure: bool = False, as_image: bool = False, base: str | None = None) -> PushOutcome:
        """Copy a version of this local store to a remote (`mreg push`): an `s3://` store or an OCI reference
        (`oci://`, `oci-layout:`, `oci-archive:`); the blobs it lacks, then the manifest. `verify_remote` is for
        S3; `force`, `as_image` and `base` for OCI (see `api.push`)."""
        return api.push(self._local("push"), ref, remote, endpoint_url=endpoint_url, progress=progress,
                        verify_remote=verify_remote, force=force, insecure=insecure, as_image=as_image, base=base)

    def sync(self, remote: str | S3Store, name: str | None = None, *, alias: str = "production",
             endpoint_url: str | None = None, progress: Progress | None = None,
             trust: TrustPolicy | Callable[[str], TrustPolicy] | None = None, insecure: bool = False) -> SyncOutcome:
        """Materialize the version a remote names in this local store, then flip the local alias (`mreg sync`):
        an S3 store's alias of `name`, or the version an OCI artifact carries."""
        return api.sync(self._local("sync"), remote, name, alias=alias, progress=progress, trust=trust,
                        insecure=insecure, endpoint_url=endpoint_url)

    def _cache(self) -> Path:
        """The cache, or the usage error a Registry without one raises where it needs one."""
        if self.cache is None:
            raise UsageError("this Registry has no cache", hint="Registry(store, cache='/srv/cache')")
        return self.cache

    def _local(self, method: str) -> LocalStore:
        """The store, where a method works on a local store only."""
        if not isinstance(self.store, LocalStore):
            raise UsageError(f"{method} works on a local store, not {self.store.location}",
                             hint="open a Registry on a directory; push and sync move versions from and to S3")
        return self.store

