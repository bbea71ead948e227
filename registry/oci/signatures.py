"""Signature records as OCI referrers of the model's manifest: pushed with the version, judged before a sync.

Each record of a version becomes one artifact, laid out as cosign attaches Sigstore bundles::

    manifest   artifactType application/vnd.dev.sigstore.bundle.v0.3+json
      subject  the model artifact's manifest (mediaType, digest, size)
      config   application/vnd.oci.empty.v1+json               {} (the empty descriptor)
      layers   application/vnd.dev.sigstore.bundle.v0.3+json   the model-signing bundle, the file
                                                               `model_signing verify --signature` takes
      annotations  dev.sigstore.bundle.content = dsse-envelope, dev.sigstore.bundle.predicateType,
                   org.opencontainers.image.created = the record's time,
                   dev.mreg.signature.{signer,key-id,method,origin,by} = the rest of the record

The layer is the bundle alone, so any tool that reads Sigstore bundle referrers reads it; the record's
other fields ride in annotations, which the referrers list repeats (who signed, with which key, when:
readable before anything is fetched). A reader rebuilds the record from them: its name, number and
manifest digest from the subject (the version's mreg manifest layer), never from the referrer; what the
annotations claim is shown, never trusted (`judge` checks the bundle). The manifest's bytes depend only
on the record, so pushing again finds it listed and sends nothing.

A referrer made by another tool (e.g. `oras attach --artifact-type application/vnd.dev.sigstore.bundle.v0.3+json`
of a bundle `model_signing sign` made on the version directory) is read too: its key id from the bundle,
its signer from the certificate or the key id, its time from `org.opencontainers.image.created`.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from manifests import Provenance, SignatureRecord
from registry.errors import GateRefused, IntegrityError, NotFound, UsageError
from registry.oci import media
from registry.oci.pack import Blob, Packed
from registry.oci.reference import DIGEST
from registry.oci.target import Target
from registry.store.protocol import Version
from registry.store.signatures import bundle_material, judge, signature_problems
from registry.store.trust import TrustPolicy

#: A bundle is a few kilobytes (a certificate chain at most tens); a larger layer is not one.
MAX_BUNDLE = 1 << 20
#: Signature referrers read per version; a list longer than this is someone's flood, and the rest is set aside.
MAX_SIGNATURES = 64
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _stamp(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _predicate(bundle: dict[str, Any]) -> str | None:
    """The in-toto statement's predicate type (model-signing's), when the envelope says one."""
    try:
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        return str(statement["predicateType"])
    except (KeyError, TypeError, ValueError):
        return None


def pack_signature(record: SignatureRecord, subject: bytes) -> Packed:
    """The referrer artifact of one record (pure): blobs (the empty config, the bundle) and its manifest."""
    # The bundle's keys in the record's order (not sorted): the record rebuilt from it is the same bytes.
    bundle = json.dumps(record.bundle, separators=(",", ":"), ensure_ascii=False).encode()
    empty = Blob(media.EMPTY_DIGEST, len(media.EMPTY_DATA), media.OCI_EMPTY, media.EMPTY_DATA)
    layer = Blob(_digest(bundle), len(bundle), media.SIGSTORE_BUNDLE, bundle)
    notes = {media.BUNDLE_CONTENT: "dsse-envelope", media.CREATED: _stamp(record.at),
             media.SIG_SIGNER: record.signer, media.SIG_KEY_ID: record.key_id, media.SIG_METHOD: record.method,
             media.SIG_ORIGIN: record.origin, media.SIG_BY: record.by.model_dump_json()}
    if (predicate := _predicate(record.bundle)) is not None:
        notes[media.BUNDLE_PREDICATE] = predicate
    doc = {
        "schemaVersion": 2,
        "mediaType": media.OCI_MANIFEST,
        "artifactType": media.SIGSTORE_BUNDLE,
        "config": {"mediaType": empty.media_type, "digest": empty.digest, "size": empty.size},
        "layers": [{"mediaType": layer.media_type, "digest": layer.digest, "size": layer.size,
                    "annotations": {media.TITLE: "model.sig"}}],
        "subject": {"mediaType": media.OCI_MANIFEST, "digest": _digest(subject), "size": len(subject)},
        "annotations": notes,
    }
    raw = _canonical(doc)
    return Packed((empty, layer), raw, _digest(raw))


def push_signatures(records: Iterable[SignatureRecord], target: Target, subject: bytes,
                    send: Callable[[Blob], None]) -> int:
    """List each record as a referrer of the model manifest `subject` unless it is listed already; returns how
    many were sent. Blobs first (`send`, only those the target lacks), each referrer manifest after them."""
    packed = [pack_signature(r, subject) for r in records]
    if not packed:
        return 0
    subject_digest = _digest(subject)
    listed = {d.get("digest") for d in target.referrers(subject_digest)}
    sent = 0
    for p in packed:
        if p.digest in listed:
            continue
        for b in p.blobs:
            if target.blob_size(b.digest) != b.size:
                send(b)
        target.put_referrer(p.manifest, media.OCI_MANIFEST, subject_digest)
        listed.add(p.digest)
        sent += 1
    return sent


@dataclass(frozen=True)
class Found:
    """The signature records a version's referrers hold, and why the others could not be read."""

    records: tuple[SignatureRecord, ...]
    damaged: tuple[str, ...]


class _Damaged(Exception):
    pass


def read_signatures(target: Target, subject: str, version: Version) -> Found:
    """Every Sigstore-bundle referrer of the manifest `subject`, read by digest and rebuilt as a record of
    `version`; one that is missing, does not hash to its digest, names another subject or does not parse is
    set aside with the reason (it proves nothing, and must not stop a valid one from counting)."""
    records: list[SignatureRecord] = []
    damaged: list[str] = []
    seen: set[str] = set()
    for d in target.referrers(subject):
        digest, kind = d.get("digest"), d.get("artifactType")
        # SBOMs and other tools' artifacts are passed over; an entry without artifactType (skopeo 1.9 drops it
        # when it copies an index) is read to find out.
        if (kind is not None and kind != media.SIGSTORE_BUNDLE) or not isinstance(digest, str) or digest in seen:
            continue
        if len(seen) == MAX_SIGNATURES:
            damaged.append(f"more than {MAX_SIGNATURES} signature referrers: the rest were not read")
            break
        seen.add(digest)
        try:
            rec = _read_one(target, digest, subject, version)
        except (_Damaged, NotFound, IntegrityError) as e:  # a missing or oversized blob: this referrer only
            damaged.append(f"referrer {digest[:19]}…: {e}")
            continue
        if rec is not None:
            records.append(rec)
    return Found(tuple(records), tuple(damaged))


def _read_one(target: Target, digest: str, subject: str, version: Version) -> SignatureRecord | None:
    """The record a referrer holds; None for a referrer that is not a Sigstore bundle."""
    if not DIGEST.match(digest):
        raise _Damaged("not a sha256 digest")
    got = target.get_manifest(digest)
    if got is None:
        raise _Damaged("listed, but the manifest is not there")
    if got.digest != digest:
        raise _Damaged(f"the manifest served hashes to {got.digest[:19]}…")
    try:
        doc = json.loads(got.data)
        layers = [m for m in doc["layers"] if m.get("mediaType") == media.SIGSTORE_BUNDLE]
        named = doc["subject"]["digest"]
        notes = dict(doc.get("annotations") or {})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise _Damaged("not an image manifest with a subject and layers") from None
    if named != subject:
        raise _Damaged(f"its subject is {str(named)[:19]}…, not this manifest")
    if doc.get("artifactType") != media.SIGSTORE_BUNDLE:
        return None
    if len(layers) != 1:
        raise _Damaged(f"{len(layers)} Sigstore bundle layers, not one")
    layer = layers[0]
    size, blob = layer.get("size"), layer.get("digest")
    if not isinstance(blob, str) or not DIGEST.match(blob) or not isinstance(size, int) or not 0 < size <= MAX_BUNDLE:
        raise _Damaged(f"the bundle layer has a bad digest or size ({size!r})")
    data = b""
    for chunk in target.open_blob(blob):
        data += chunk
        if len(data) > size:
            break
    if _digest(data) != blob:
        raise _Damaged(f"the bundle does not match its digest {blob[:19]}… (tampered or cut short)")
    try:
        bundle = json.loads(data)
    except ValueError:
        bundle = None
    if not isinstance(bundle, dict):
        raise _Damaged("the bundle is not a JSON object")
    return _record(bundle, {str(k): str(v) for k, v in notes.items()}, version, target.location)


def _record(bundle: dict[str, Any], notes: dict[str, str], version: Version, where: str) -> SignatureRecord:
    """The record a referrer stands for: the version from the subject, the claims from the annotations (or,
    from another tool, what the bundle and the OCI creation time say)."""
    method, kid, cert_subject = notes.get(media.SIG_METHOD), notes.get(media.SIG_KEY_ID), None
    if method is None or kid is None:
        try:
            method, kid, cert_subject = bundle_material(bundle)
        except (ValueError, KeyError, TypeError) as e:
            raise _Damaged(f"the bundle does not parse: {e}") from None
        except UsageError as e:
            raise _Damaged(f"no mreg annotations, and {e}") from None
    try:
        at = dt.datetime.fromisoformat(notes[media.CREATED].replace("Z", "+00:00")) \
            if media.CREATED in notes else _EPOCH
        if at.tzinfo is None:
            raise ValueError("a time without a zone")
        by = Provenance.model_validate_json(notes[media.SIG_BY]) if media.SIG_BY in notes else Provenance(
            user="unknown", host=where, at=at, mreg_version="", python="")
        return SignatureRecord(
            name=version.name, version=version.number, manifest_sha256=version.manifest_sha256,
            method=method,  # type: ignore[arg-type]  # validated by the model
            key_id=kid, signer=notes.get(media.SIG_SIGNER) or cert_subject or f"key {kid[:12]}…", at=at, by=by,
            origin=notes.get(media.SIG_ORIGIN, "import"),  # type: ignore[arg-type]
            bundle=bundle)
    except ValueError as e:  # pydantic's ValidationError is one
        raise _Damaged(f"its annotations are not a signature record ({str(e).splitlines()[0]})") from None


def admitted(found: Found, version: Version, policy: TrustPolicy | None, where: str) -> list[SignatureRecord]:
    """The records a sync keeps: without a policy, every one read; with one, the valid ones, and GateRefused
    (naming each signer found, its verdict, and the policy missed) when there is none."""
    if policy is None or policy.empty:
        return list(found.records)
    results = [judge(r, version, policy) for r in found.records]
    problems = signature_problems(results, version, policy)
    if problems:
        damaged = f"; set aside: {'; '.join(found.damaged[:3])}" if found.damaged else ""
        raise GateRefused(f"{where}: {version.name}@{version.number} was not synced: {'; '.join(problems)}{damaged}",
                          hint=f"sign {version.name}@{version.number} with a key {policy.origin} trusts and push "
                               "it again (its signatures travel as referrers); nothing was downloaded and no "
                               "alias changed")
    return [r.record for r in results if r.status == "valid"]
