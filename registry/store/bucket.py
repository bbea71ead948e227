"""The objects of an S3 bucket under a prefix, through boto3: get, conditional put, list, delete, multipart.

Every botocore error becomes an mreg error here (`wrap_error`); a body cut mid-way is one too.
What the objects mean (versions, aliases, leases) is `registry.store.s3`'s business.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from registry.errors import IntegrityError, NotFound, StoreUnreachable, UsageError
from registry.incoming import page_cap, stall_floor, unstalled


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


class Bucket:
    """A bucket and a key prefix: the primitive object operations the S3 store is built of."""

    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = parse_url(url)
        self.location = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.floor = stall_floor()
        session = boto3.session.Session()
        self.s3: Any = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=session.region_name or "us-east-1",
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32,
                          read_timeout=self.floor.read_timeout,
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"),
        )

    def key(self, *parts: str) -> str:
        """The object key of a path inside the store."""
        return "/".join(p for p in (self.prefix, *parts) if p)

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
        return self._arrivals(r["Body"], doing), r["ETag"]

    def _arrivals(self, body: Any, doing: str) -> Iterator[bytes]:
        """A body's bytes as they arrive, held to the stall floor. One network read at a time (urllib3's `read1`):
        botocore's own reads wait for a whole chunk, however slowly it comes."""
        from urllib3.exceptions import HTTPError as TransportError

        read1 = getattr(getattr(body, "_raw_stream", None), "read1", None)
        reads = iter(lambda: read1(BODY_CHUNK), b"") if read1 is not None else body.iter_chunks(BODY_CHUNK)
        try:
            yield from unstalled(reads, doing, self.floor)
        except (BotoCoreError, TransportError) as e:
            body.close()
            raise wrap_error(e, doing) from e
        except BaseException:  # a stall, or the reader gave up: the connection is not left trickling
            body.close()
            raise

    def get(self, key: str) -> RemoteObject | None:
        """A small object (manifest, alias, lease) whole, or None when it does not exist."""
        doing = f"reading s3://{self.bucket}/{key}"
        r = self._get_object(key, doing, missing_ok=True)
        if r is None:
            return None
        return RemoteObject(b"".join(self._arrivals(r["Body"], doing)), r["ETag"])  # a dropped connection: one line

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
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        """An object's size (HEAD), or None when there is none."""
        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
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
            pages = self.s3.get_paginator("list_objects_v2").paginate(**kwargs)
            for page in page_cap(pages, f"listing s3://{self.bucket}/{prefix}"):
                if delimiter:
                    yield from page.get("CommonPrefixes", [])
                else:
                    yield from page.get("Contents", [])
        except (ClientError, BotoCoreError) as e:
            raise wrap_error(e, f"listing s3://{self.bucket}/{prefix}") from e

    def multipart_uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Multipart uploads begun and neither completed nor aborted under a prefix, across pages."""
        try:
            pages = self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in page_cap(pages, f"listing multipart uploads under s3://{self.bucket}/{prefix}"):
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
