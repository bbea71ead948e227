"""A store in S3 or any S3-compatible server: immutable keys and conditional writes; no rename, no LIST for correctness.

Layout under `s3://bucket/prefix/`::

    blobs/sha256/ab/ab12…                       immutable; uploaded with a SHA-256 checksum the server verifies
    models/<name>/versions/<n>/manifest.json    create-only PUT (If-None-Match: *): allocates <n>, publishes the version
    models/<name>/keys/<conversion key>.json    {"version": n}: finds a re-push without listing
    models/<name>/aliases/<alias>.json          an AliasRecord (target + its history), replaced by If-Match on its ETag
    leases/<uuid>.json                          digests an in-flight push will reference (gc treats them as roots)
    gc.lock                                     held by a running gc (create-only); pushes wait while it exists

Readers go alias record → manifest → blobs by key; LIST only serves `list` and gc.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from manifests import AliasRecord, CheckRecord, HistoryEntry, Manifest
from registry import layout
from registry.errors import (
    Conflict,
    IntegrityError,
    ModelNotFound,
    NotFound,
    StoreUnreachable,
    UsageError,
    VersionNotFound,
)
from registry.refs import Ref
from registry.store.protocol import AliasDecision, Version, manifest_bytes, resolve_ref

GC_LOCK_TTL_S = 3600
LEASE_TTL_S = 24 * 3600


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → ("bucket", "some/prefix")."""
    if not url.startswith("s3://"):
        raise UsageError(f"not an S3 URL: {url!r}", hint="use s3://BUCKET[/PREFIX]")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise UsageError(f"no bucket in {url!r}", hint="use s3://BUCKET[/PREFIX]")
    return bucket, prefix.strip("/")


#: Bytes per chunk when a body is streamed.
BODY_CHUNK = 1 << 20

@dataclass(frozen=True)
class RemoteObject:
    """An object's bytes and ETag."""

    data: bytes
    etag: str


class S3Store:
    """A store in a bucket, through boto3 (credentials, region and endpoint from the standard chain)."""

    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = parse_url(url)
        self.location = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        session = boto3.session.Session()
        self.s3: Any = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=session.region_name or "us-east-1",
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32,
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"),
        )

    # -- keys and primitive operations ---------------------------------------------------

    def key(self, *parts: str) -> str:
        """The object key of a path inside the store."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def blob_key(self, sha256: str) -> str:
        """The key of a blob."""
        return self.key(*layout.s3_blob(sha256))

    def manifest_key(self, name: str, number: int) -> str:
        """The key of a version's manifest."""
        return self.key(*layout.s3_manifest(name, number))

    def alias_key(self, name: str, alias: str) -> str:
        """The key of an alias record."""
        return self.key(*layout.s3_alias(name, alias))

    def url(self, key: str) -> str:
        """The s3:// URL of an object: what an error names."""
        return f"s3://{self.bucket}/{key}"

    def _get_object(self, key: str, doing: str, missing_ok: bool) -> dict[str, Any] | None:
        try:
            r: dict[str, Any] = self.s3.get_object(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as e:
            if missing_ok and _code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise wrap_error(e, doing) from e
        return r

    def open(self, key: str, doing: str, *, missing_ok: bool = True) -> tuple[Iterator[bytes], str] | None:
        """An object's body as chunks while they arrive, and its ETag; None when it does not exist (with missing_ok).

        A failure of the request or in the middle of the body (a dropped connection) is the same
        one-line error, "{doing} failed: …".
        """
        r = self._get_object(key, doing, missing_ok)
        if r is None:
            return None

        def chunks() -> Iterator[bytes]:
            try:
                yield from r["Body"].iter_chunks(BODY_CHUNK)
            except BotoCoreError as e:
                raise wrap_error(e, doing) from e

        return chunks(), r["ETag"]

    def get(self, key: str) -> RemoteObject | None:
        """A small object (manifest, alias, lease) whole, or None when it does not exist."""
        doing = f"reading s3://{self.bucket}/{key}"
        r = self._get_object(key, doing, missing_ok=True)
        if r is None:
            return None
        try:
            return RemoteObject(r["Body"].read(), r["ETag"])
        except BotoCoreError as e:  # the connection dropped mid-body
            raise wrap_error(e, doing) from e

    def upload_file(self, path: Path, key: str, sha256: str, on_bytes: Callable[[int], None], *, part_size: int,
                    threshold: int) -> None:
        """A large file as a multipart upload (4 parts in flight), each part checked by the server's SHA-256."""
        from boto3.exceptions import S3UploadFailedError
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=threshold, multipart_chunksize=part_size, max_concurrency=4)
        try:
            self.s3.upload_file(str(path), self.bucket, key, Config=config, Callback=on_bytes,
                                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": sha256}})
        except (ClientError, BotoCoreError, S3UploadFailedError) as e:
            raise wrap_error(e, f"uploading s3://{self.bucket}/{key}") from e

    def exists(self, key: str) -> bool:
        """Whether an object exists (HEAD)."""
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise wrap_error(e, f"checking s3://{self.bucket}/{key}") from e

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            sha256: str | None = None) -> str:
        """Write an object (optionally create-only or compare-and-swap); the server checks its SHA-256 (the one
        given, e.g. a blob's name, else the body's own) and refuses a mismatch. Returns the ETag."""
        digest = bytes.fromhex(sha256) if sha256 else hashlib.sha256(data).digest()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data,
                                  "ChecksumSHA256": base64.b64encode(digest).decode()}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            etag: str = self.s3.put_object(**kwargs)["ETag"]
            return etag
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise PreconditionFailed(key) from e
            raise wrap_error(e, f"writing s3://{self.bucket}/{key}") from e

    def delete(self, key: str) -> None:
        """Delete an object (absent is fine)."""
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as e:
            raise wrap_error(e, f"deleting s3://{self.bucket}/{key}") from e

    def list_objects(self, prefix: str, *, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        """Objects (or common prefixes, with a delimiter) under a prefix, across pages."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(**kwargs):
                if delimiter:
                    yield from page.get("CommonPrefixes", [])
                else:
                    yield from page.get("Contents", [])
        except (ClientError, BotoCoreError) as e:
            raise wrap_error(e, f"listing s3://{self.bucket}/{prefix}") from e

    def multipart_uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Multipart uploads begun and neither completed nor aborted under a prefix, across pages."""
        try:
            for page in self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
                yield from page.get("Uploads", [])
        except (ClientError, BotoCoreError) as e:
            raise wrap_error(e, f"listing multipart uploads under s3://{self.bucket}/{prefix}") from e

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort a multipart upload, dropping its parts (already gone is fine)."""
        try:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("NoSuchUpload", "404"):
                return
            raise wrap_error(e, f"aborting the upload of s3://{self.bucket}/{key}") from e

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
            tail = p["Prefix"][len(base):].rstrip("/")
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)

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
        url = self.url(self.manifest_key(name, number))
        try:
            manifest = Manifest.model_validate_json(data)
        except ValueError as e:
            raise IntegrityError(f"{name}@{number}: remote manifest {url} does not parse",
                                 hint=f"run `mreg verify {name}@{number} --store {self.location}`") from e
        if (manifest.name, manifest.version) != (name, number):
            raise IntegrityError(f"{url} says it is {manifest.name}@{manifest.version}, not {name}@{number}",
                                 hint=_ALTERED.format(location=self.location))
        return manifest

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
                          history=(*history, entry))
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
        return current, entry

    # -- versions ------------------------------------------------------------------------

    def find_by_key(self, name: str, key: str) -> Version | None:
        """The version made from exactly these inputs, via the key index (no LIST)."""
        index = self.key(*layout.s3_key_index(name, key))
        obj = self.get(index)
        if obj is not None:
            v = self.version(name, int(json.loads(obj.data)["version"]))
            return v if v.manifest.key == key else None
        # A push killed between its manifest and its index: look at the newest manifests, repair the index.
        for n in reversed(self.versions(name)[-50:]):
            v = self.version(name, n)
            if v.manifest.key == key:
                self.put(index, json.dumps({"version": n}).encode())
                return v
        return None

    def alias_mount(self, name: str, alias: str) -> str | None:
        """None: an S3 alias is followed by `mreg sync`, not mounted."""
        return None

    def files_dir(self, version: Version) -> Path | None:
        """None: the files are remote."""
        return None

    def check_records(self, name: str, number: int) -> list[CheckRecord] | None:
        """None: golden-check records are kept in local stores only."""
        return None

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

    def take_lease(self, digests: list[str]) -> str:
        """Announce the blobs an in-flight push will reference; waits while a gc runs."""
        key = self.key(*layout.s3_lease(uuid.uuid4().hex))
        self.put(key, json.dumps({"digests": digests, "at": time.time()}).encode())
        deadline = time.monotonic() + 300
        while (lock := self.get(self.key(*layout.s3_gc_lock()))) is not None:
            if time.time() - json.loads(lock.data).get("at", 0) > GC_LOCK_TTL_S:
                break  # a gc that died long ago
            if time.monotonic() > deadline:
                self.delete(key)
                raise Conflict("a gc is running in this store", hint="retry the push when it has finished")
            time.sleep(1)
        return key


#: The next step after finding a remote object that disagrees with the key it was read from.
_ALTERED = ("the object was changed outside mreg: restore it from a good copy or delete it, then run "
            "`mreg verify --all --store {location}`")


class PreconditionFailed(Exception):
    """A conditional write lost (412)."""


def _code(e: BaseException) -> str:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    return ""


def wrap_error(e: BaseException, doing: str) -> Exception:
    """The MregError for a boto3/botocore failure."""
    code = _code(e)
    if code in ("BadDigest", "XAmzContentSHA256Mismatch", "InvalidDigest"):
        return IntegrityError(f"{doing}: the server computed a different SHA-256 than the one sent ({code})",
                              hint="the local file does not match its digest: run `mreg verify --all`")
    if code in ("NoSuchBucket",):
        return NotFound(f"{doing}: the bucket does not exist", hint="create it, or check --store")
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
        return UsageError(f"{doing}: access denied ({code})",
                          hint="check the AWS credentials (environment, ~/.aws, instance role) for this bucket")
    return StoreUnreachable(f"{doing} failed: {str(e).splitlines()[0]}",
                          hint="check --endpoint-url / AWS_ENDPOINT_URL and the network, then retry")


def utcnow() -> dt.datetime:
    """Now, in UTC."""
    return dt.datetime.now(dt.timezone.utc)
