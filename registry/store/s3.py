"""A store in S3 or any S3-compatible server: immutable keys and conditional writes; no rename, no LIST for correctness.

Layout under `s3://bucket/prefix/`::

    blobs/sha256/ab/ab12…                       immutable; uploaded with a SHA-256 checksum the server verifies
    models/<name>/versions/<n>/manifest.json    create-only PUT (If-None-Match: *): allocates <n>, publishes the version
    models/<name>/keys/<conversion key>.json    {"version": n}: finds a re-push without listing
    models/<name>/aliases/<alias>.json          an AliasRecord (target + its history), replaced by If-Match on its ETag
    leases/<uuid>.json                          digests an in-flight push will reference (gc treats them as roots)
    conversions/<name>/<key>.json               the lease of a conversion in progress (registry.store.lease)
    gc.lock                                     held by a running gc (create-only); pushes wait while it exists

Readers go alias record → manifest → blobs by key; LIST only serves `list` and gc.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
import uuid
from pathlib import Path

from manifests import AliasRecord, CheckRecord, HistoryEntry, Manifest, RolloutRecord, SignatureRecord
from registry import layout
from registry.errors import (
    Conflict,
    IntegrityError,
    ModelNotFound,
    NotFound,
    VersionNotFound,
)
from registry.refs import Ref
from registry.store.bucket import Bucket, PreconditionFailed, RemoteObject, wrap_error
from registry.store.protocol import (
    AliasDecision,
    Listener,
    RolloutChange,
    RolloutDecision,
    Version,
    manifest_bytes,
    read_manifest,
    resolve_ref,
    tell,
)

__all__ = ["GC_LOCK_TTL_S", "LEASE_TTL_S", "PreconditionFailed", "RemoteObject", "S3Store", "wrap_error"]

GC_LOCK_TTL_S = 3600
LEASE_TTL_S = 24 * 3600




class S3Store(Bucket):
    """A store in a bucket, through boto3 (credentials, region and endpoint from the standard chain)."""

    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        super().__init__(url, endpoint_url=endpoint_url)
        self.listeners: list[Listener] = []

    def blob_key(self, sha256: str) -> str:
        """The key of a blob."""
        return self.key(*layout.s3_blob(sha256))

    def manifest_key(self, name: str, number: int) -> str:
        """The key of a version's manifest."""
        return self.key(*layout.s3_manifest(name, number))

    def alias_key(self, name: str, alias: str) -> str:
        """The key of an alias record."""
        return self.key(*layout.s3_alias(name, alias))

    # -- the Store protocol --------------------------------------------------------------

    def models(self) -> list[str]:
        """Names of the models in the store (LIST: for display only)."""
        base = self.key(*layout.s3_models()) + "/"
        return sorted(p["Prefix"][len(base):].rstrip("/") for p in self.list_objects(base, delimiter="/"))

    def has_model(self, name: str) -> bool:
        """Whether any version of the model exists."""
        return bool(self.versions(name))

    def versions(self, name: str) -> list[int]:
        """Published version numbers (LIST: for display and allocation hints only)."""
        base = self.key(*layout.s3_versions(name)) + "/"
        out = []
        for p in self.list_objects(base, delimiter="/"):
            n = layout.parse_version(p["Prefix"][len(base):].rstrip("/"))  # "²" or "01" is no version of ours
            if n is not None:
                out.append(n)
        return sorted(out)

    def survey(self, name: str) -> tuple[list[int], list[IntegrityError]]:
        """The published versions; a bucket has no entries of its own to report (a key that is not a version
        number is not listed as one)."""
        return self.versions(name), []

    def version(self, name: str, number: int) -> Version:
        """One published version (by key, no LIST)."""
        obj = self.get(self.manifest_key(name, number))
        if obj is None:
            if not self.versions(name):
                raise ModelNotFound(name)
            raise VersionNotFound(name, str(number))
        manifest = self.checked_manifest(name, number, obj.data)
        return Version(name, number, manifest, hashlib.sha256(obj.data).hexdigest(),
                       f"s3://{self.bucket}/{self.key(*layout.s3_version(name, number))}")

    def checked_manifest(self, name: str, number: int, data: bytes) -> Manifest:
        """The manifest read from `name`'s version `number`, once it parses and says it is that version.

        A manifest names the local directory a sync writes and the number it publishes: one that
        disagrees with its key would land in another model or leave a local alias dangling.
        """
        return read_manifest(data, name, number, self.url(self.manifest_key(name, number)),
                             hint=_ALTERED.format(location=self.location))

    def resolve(self, ref: Ref) -> Version:
        """The version a reference names."""
        return resolve_ref(self, ref)

    def alias_record(self, name: str, alias: str) -> tuple[AliasRecord | None, str | None]:
        """An alias record and its ETag (both None when the alias does not exist)."""
        key = self.alias_key(name, alias)
        obj = self.get(key)
        if obj is None:
            return None, None
        try:
            rec = AliasRecord.model_validate_json(obj.data)
        except ValueError as e:
            raise IntegrityError(f"alias record {self.url(key)} does not parse",
                                 hint=_ALTERED.format(location=self.location)) from e
        if (rec.name, rec.alias) != (name, alias):
            raise IntegrityError(f"{self.url(key)} says it is alias {rec.alias} of {rec.name}, not {alias} of {name}",
                                 hint=_ALTERED.format(location=self.location))
        return rec, obj.etag

    def missing_target(self, name: str, alias: str, number: int) -> IntegrityError:
        """The error for an alias record whose target version does not exist."""
        return IntegrityError(
            f"{self.url(self.alias_key(name, alias))} points to {name}@{number}, which does not exist in the store",
            hint=f"point the alias at a version that exists (`mreg promote {name}@N --alias {alias} --store "
                 f"{self.location}`); if nobody there moved it, find out who can write the bucket",
        )

    def _target(self, name: str, alias: str, rec: AliasRecord) -> int:
        """An alias record's target, once its manifest is known to exist (HEAD)."""
        if not self.exists(self.manifest_key(name, rec.version)):
            raise self.missing_target(name, alias, rec.version)
        return rec.version

    def aliases(self, name: str) -> dict[str, int]:
        """Every alias of a model and its target."""
        base = self.key(*layout.s3_aliases(name)) + "/"
        out = {}
        for o in self.list_objects(base):
            alias = o["Key"][len(base):].removesuffix(".json")
            rec, _ = self.alias_record(name, alias)
            if rec is not None:
                out[alias] = self._target(name, alias, rec)
        return dict(sorted(out.items()))

    def alias(self, name: str, alias: str) -> int | None:
        """An alias's target (IntegrityError when the record disagrees with its key or names no version)."""
        rec, _ = self.alias_record(name, alias)
        return self._target(name, alias, rec) if rec else None

    def history(self, name: str) -> list[HistoryEntry]:
        """Every alias change of a model, oldest first (merged from the alias records)."""
        entries: list[HistoryEntry] = []
        base = self.key(*layout.s3_aliases(name)) + "/"
        for o in self.list_objects(base):
            rec, _ = self.alias_record(name, o["Key"][len(base):].removesuffix(".json"))
            if rec is not None:
                entries.extend(rec.history)
        return sorted(entries, key=lambda e: e.by.at)

    def last_entry(self, name: str, alias: str) -> HistoryEntry | None:
        """The newest entry of one alias."""
        rec, _ = self.alias_record(name, alias)
        return rec.history[-1] if rec and rec.history else None

    def transact_alias(self, name: str, alias: str, decide: AliasDecision) -> tuple[int | None, HistoryEntry | None]:
        """Read the alias record, decide, write it back only if nobody changed it meanwhile (If-Match)."""
        rec, etag = self.alias_record(name, alias)
        if rec is None and not self.has_model(name):
            raise ModelNotFound(name)
        current = rec.version if rec else None
        history = list(rec.history) if rec else []
        entry = decide(current, lambda: history)
        if entry is None:
            return current, None
        target = self.version(name, entry.to_version)
        new = AliasRecord(name=name, alias=alias, version=target.number, manifest_sha256=target.manifest_sha256,
                          history=(*history, entry), rollout=rec.rollout if rec else None)
        self._swap(name, alias, new, etag)
        tell(self.listeners, name, entry)
        return current, entry

    def _swap(self, name: str, alias: str, new: AliasRecord, etag: str | None) -> None:
        """Write an alias record only if it is still the one read (If-Match its ETag; If-None-Match: * if none)."""
        data = new.model_dump_json(by_alias=True).encode()
        try:
            if etag is None:
                self.put(self.alias_key(name, alias), data, if_none_match=True)
            else:
                self.put(self.alias_key(name, alias), data, if_match=etag)
        except PreconditionFailed as e:
            raise Conflict(
                f"lost a race: {name} {alias} was changed by another writer while this one ran; nothing changed",
                hint=f"run `mreg history {name} --store {self.location}` and retry",
            ) from e

    def rollout(self, name: str, alias: str) -> RolloutRecord | None:
        """The rollout record kept in the alias's own record."""
        rec, _ = self.alias_record(name, alias)
        return rec.rollout if rec else None

    def transact_rollout(self, name: str, alias: str, decide: RolloutDecision
                         ) -> tuple[int | None, RolloutRecord | None, RolloutChange | None]:
        """Read the alias record (target, history, rollout), decide, and write all three back in one conditional
        PUT: a step's weight, the alias's target and the entry recording them commit together."""
        rec, etag = self.alias_record(name, alias)
        if rec is None and not self.has_model(name):
            raise ModelNotFound(name)
        current = rec.version if rec else None
        history = list(rec.history) if rec else []
        before = rec.rollout if rec else None
        change = decide(current, before, lambda: history)
        if change is None:
            return current, before, None
        if rec is None:
            raise NotFound(f"{name} has no alias {alias}", hint=f"run `mreg promote {name}@VERSION --alias {alias}`")
        to = change.entry.to_version if change.entry is not None else rec.version
        target = rec if to == rec.version else None
        sha = target.manifest_sha256 if target else self.version(name, to).manifest_sha256
        new = AliasRecord(name=name, alias=alias, version=to, manifest_sha256=sha,
                          history=(*history, change.entry) if change.entry else tuple(history), rollout=change.record)
        self._swap(name, alias, new, etag)
        if change.entry is not None:
            tell(self.listeners, name, change.entry)
        return current, before, change

    def keep_undelivered(self, record: dict[str, object]) -> str:
        """Write the undelivered event as its own object (no append on S3)."""
        url_digest = hashlib.sha256(str(record.get("url", "")).encode()).hexdigest()
        key = self.key(*layout.s3_undelivered(str(record.get("id", uuid.uuid4().hex)), url_digest))
        self.put(key, json.dumps(record, sort_keys=True, default=str).encode())
        return self.url(key)

    def point_alias(self, name: str, alias: str, number: int) -> None:
        """Write a rollout's canary alias record (its history stays in the main alias's record)."""
        rec, etag = self.alias_record(name, alias)
        target = self.version(name, number)
        self._swap(name, alias, AliasRecord(name=name, alias=alias, version=number,
                                            manifest_sha256=target.manifest_sha256,
                                            history=rec.history if rec else ()), etag)

    def drop_alias(self, name: str, alias: str) -> None:
        """Delete a rollout's canary alias record (absent is fine)."""
        self.delete(self.alias_key(name, alias))

    # -- versions ------------------------------------------------------------------------

    def find_by_key(self, name: str, key: str) -> Version | None:
        """The version made from exactly these inputs, via the key index (no LIST)."""
        index = self.key(*layout.s3_key_index(name, key))
        obj = self.get(index)
        if obj is not None:
            try:
                number = json.loads(obj.data)["version"]
                if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                    raise TypeError(number)
            except (ValueError, TypeError, KeyError) as e:
                raise IntegrityError(f"{self.url(index)} is not a key index mreg wrote ({type(e).__name__})",
                                     hint=f"delete it (the next push writes it again), then run "
                                          f"`mreg verify --all --store {self.location}`") from None
            v = self.version(name, number)
            return v if v.manifest.key == key else None
        # A push killed between its manifest and its index: look at the newest manifests, repair the index.
        for n in reversed(self.versions(name)[-50:]):
            v = self.version(name, n)
            if v.manifest.key == key:
                self.put(index, json.dumps({"version": n}).encode())
                return v
        return None

    def is_store(self) -> bool:
        """A bucket prefix always exists; a missing bucket is reported by the first request."""
        return True

    def alias_mount(self, name: str, alias: str) -> str | None:
        """None: an S3 alias is followed by `mreg sync`, not mounted."""
        return None

    def files_dir(self, version: Version) -> Path | None:
        """None: the files are remote."""
        return None

    def check_records(self, name: str, number: int) -> list[CheckRecord] | None:
        """None: golden-check records are kept in local stores only."""
        return None

    def signatures_prefix(self, name: str, number: int) -> str:
        """The key prefix of a version's signature records."""
        return self.key(*layout.s3_signatures(name, number)) + "/"

    def signature_keys(self, name: str, number: int) -> list[str]:
        """The keys of a version's signature records, oldest first."""
        return sorted(o["Key"] for o in self.list_objects(self.signatures_prefix(name, number))
                      if str(o["Key"]).endswith(".json"))

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Every signature record of a version, oldest first; one that does not parse is an IntegrityError."""
        out = []
        for key in self.signature_keys(name, number):
            obj = self.get(key)
            if obj is None:
                continue
            try:
                rec = SignatureRecord.model_validate_json(obj.data)
            except ValueError as e:
                raise IntegrityError(f"{self.url(key)} is not a signature record: {str(e).splitlines()[0]}",
                                     hint=_ALTERED.format(location=self.location)) from None
            if (rec.name, rec.version) != (name, number):  # a sync writes it under the name it carries
                raise IntegrityError(f"{self.url(key)} says it signs {rec.name}@{rec.version}, not {name}@{number}",
                                     hint=_ALTERED.format(location=self.location))
            out.append(rec)
        return out

    def publish_manifest(self, manifest: Manifest) -> Version:
        """Create the manifest under the next free number (create-only PUT; on collision, the next)."""
        taken = self.versions(manifest.name)
        number = (taken[-1] + 1) if taken else 1
        while True:
            final = manifest.model_copy(update={"version": number})
            data = manifest_bytes(final)
            try:
                self.put(self.manifest_key(manifest.name, number), data, if_none_match=True)
                break
            except PreconditionFailed:
                number += 1
        self.put(self.key(*layout.s3_key_index(manifest.name, manifest.key)),
                 json.dumps({"version": number}).encode())
        return Version(manifest.name, number, final, hashlib.sha256(data).hexdigest(),
                       f"s3://{self.bucket}/{self.key(*layout.s3_version(manifest.name, number))}")

    # -- leases and the gc lock ----------------------------------------------------------

    def conversion_slot(self, name: str, key: str) -> ConversionSlot:
        """Where the lease of one conversion lives."""
        return ConversionSlot(self, self.key(*layout.s3_conversion_lease(name, key)))

    def take_lease(self, digests: list[str]) -> str:
        """Announce the blobs an in-flight push will reference; waits while a gc runs."""
        key = self.key(*layout.s3_lease(uuid.uuid4().hex))
        self.put(key, json.dumps({"digests": digests, "at": time.time()}).encode())
        deadline = time.monotonic() + 300
        while (lock := self.get(self.key(*layout.s3_gc_lock()))) is not None:
            try:
                taken = float(json.loads(lock.data).get("at", 0))
            except (ValueError, TypeError, AttributeError):
                taken = 0.0  # not a lock mreg wrote
            if time.time() - taken > GC_LOCK_TTL_S:
                break  # a gc that died long ago
            if time.monotonic() > deadline:
                self.delete(key)
                raise Conflict("a gc is running in this store", hint="retry the push when it has finished")
            time.sleep(1)
        return key


class ConversionSlot:
    """A conversion lease as an object: created with If-None-Match: *, replaced with If-Match on its ETag."""

    def __init__(self, store: S3Store, key: str) -> None:
        self.store, self.key = store, key
        self.where = store.url(key)

    def create(self, data: bytes) -> str | None:
        """Create-only PUT: the ETag, or None when a lease exists."""
        try:
            return self.store.put(self.key, data, if_none_match=True)
        except PreconditionFailed:
            return None

    def read(self) -> tuple[bytes, str] | None:
        """The lease's bytes and ETag."""
        obj = self.store.get(self.key)
        return (obj.data, obj.etag) if obj is not None else None

    def replace(self, data: bytes, token: str) -> str | None:
        """PUT If-Match: the new ETag, or None when the lease changed since it was read."""
        try:
            return self.store.put(self.key, data, if_match=token)
        except PreconditionFailed:
            return None
        except NotFound:
            return None

    def delete(self, token: str) -> None:
        """DELETE, when the lease still has `token` (a conditional DELETE is not offered by every server: the read
        and the delete are two requests, and a takeover in between is the one it can remove)."""
        now = self.read()
        if now is not None and now[1] == token:
            self.store.delete(self.key)


#: The next step after finding a remote object that disagrees with the key it was read from.
_ALTERED = ("the object was changed outside mreg: restore it from a good copy or delete it, then run "
            "`mreg verify --all --store {location}`")


def utcnow() -> dt.datetime:
    """Now, in UTC."""
    return dt.datetime.now(dt.timezone.utc)
