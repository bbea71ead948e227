"""Signing versions with OpenSSF model-signing, and judging signatures against a trust policy.

A signature covers exactly the version directory as `mreg resolve --physical` shows it: every file
the manifest lists (`<artifact path>/<file path>`) and `manifest.json` itself, each by sha256, in
model-signing's in-toto statement (a DSSE envelope in a Sigstore bundle; no transparency log, no
network). So `model_signing verify key --signature SIG --public_key PUB <version dir>` accepts what
mreg signs, and a bundle the model_signing CLI made on a version directory is accepted here.

Records live beside the version, never inside it (the version directory stays exactly what was
signed)::

    models/<name>/signatures/<n>/<UTC time>-<key id[:12]>.json    a SignatureRecord (bundle inside)

model-signing is an optional dependency (the `sign` extra), imported only here and only when used.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from manifests import SignatureRecord
from registry import atomic, layout, provenance
from registry.errors import IntegrityError, UsageError
from registry.inputs import check_input, read_input
from registry.store.local import LocalStore
from registry.store.protocol import Store, Version
from registry.store.trust import TrustPolicy

Status = Literal["valid", "invalid", "untrusted"]


@dataclass(frozen=True)
class SignatureResult:
    """The verdict on one signature of a version."""

    record: SignatureRecord
    status: Status
    reason: str
    #: The trusted key file or root certificate that vouched for it (valid ones only).
    trusted_by: str | None = None


@dataclass(frozen=True)
class _Refused:
    status: Status
    reason: str


def _ms() -> Any:
    """The model_signing modules mreg uses, or a usage error that says how to install them."""
    try:
        from model_signing import hashing
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb, signing
    except ImportError as e:
        raise UsageError(f"signing needs the model-signing package ({e})",
                         hint="pip install 'mreg[sign]'") from None
    return hashing, signing, sign_ec_key, sign_certificate, sign_sigstore_pb


def expected_files(version: Version) -> dict[str, str]:
    """What a signature of this version must list: relative path → sha256 (the manifest included)."""
    files = {f"{a.path}/{f.path}": f.sha256 for a in version.manifest.artifacts for f in a.files}
    files[layout.MANIFEST] = version.manifest_sha256
    return files


def _hash_files(root: Path, rels: Iterable[str]) -> Any:
    hashing = _ms()[0]
    config = hashing.Config().use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
    return config.hash(root, files_to_hash=[root / r for r in sorted(rels)])


def _digests(ms_manifest: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for rd in ms_manifest.resource_descriptors():
        if rd.digest.algorithm != "sha256":
            raise ValueError(f"{rd.identifier} is hashed with {rd.digest.algorithm}, not sha256")
        out[str(rd.identifier)] = rd.digest.digest_hex
    return out


def _differences(signed: Mapping[str, str], actual: Mapping[str, str], what: str) -> list[str]:
    out = [f"{p} is {what} but not signed" for p in sorted(set(actual) - set(signed))]
    out += [f"{p} is signed but not {what}" for p in sorted(set(signed) - set(actual))]
    out += [f"{p}: signed sha256 {signed[p][:12]}…, {what} {actual[p][:12]}…"
            for p in sorted(set(signed) & set(actual)) if signed[p] != actual[p]]
    return out


def sign(store: LocalStore, version: Version, *, key: Path, certificate: Path | None = None,
         chain: Iterable[Path] = (), password: str | None = None, signer: str | None = None) -> SignatureRecord:
    """Hash the version's files, check them against the manifest, sign them and keep the record."""
    _, signing, sign_ec_key, sign_certificate, _ = _ms()
    root = Path(version.path)
    expected = expected_files(version)
    try:
        ms_manifest = _hash_files(root, expected)
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{version.name}@{version.number} cannot be hashed for signing: {e}",
                             hint=f"run `mreg verify {version.name}@{version.number}`") from e
    problems = _differences(expected, _digests(ms_manifest), "on disk")
    if problems:
        raise IntegrityError(f"{version.name}@{version.number} does not match its manifest: {'; '.join(problems)}",
                             hint=f"run `mreg verify {version.name}@{version.number}`; nothing was signed")
    try:
        if certificate is not None:
            s = sign_certificate.Signer(key, certificate, list(chain))
        else:
            # model-signing 1.1 types the password as str but hands it to cryptography, which takes bytes.
            s = sign_ec_key.Signer(key, password.encode() if password is not None else None)
        bundle = json.loads(s.sign(signing.Payload(ms_manifest)).bundle.to_json())
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"cannot sign with {key}: {e}",
                         hint="give a PEM elliptic-curve private key (P-256, P-384 or P-521)"
                              + (" and the certificate made for it" if certificate else "")) from e
    return _keep(store, version, bundle, signer, "sign")


def import_bundle(store: LocalStore, version: Version, path: Path, signer: str | None = None) -> SignatureRecord:
    """Keep a bundle made elsewhere (the model_signing CLI on the version directory) as a signature record.

    It must parse and list exactly this version's files; whether it is trusted is judged when verified.
    """
    try:
        bundle = json.loads(path.read_text())
        sig = _read_bundle(bundle)
        payload = json.loads(sig.bundle.dsse_envelope.payload)  # ProtoBytes: already decoded
        signed = _digests(_ms()[1].dsse_payload_to_manifest(payload))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path} is not a model-signing bundle: {e}",
                         hint="give the file `model_signing sign … --signature FILE` wrote") from e
    problems = _differences(signed, expected_files(version), f"in {version.name}@{version.number}")
    if problems:
        raise IntegrityError(f"{path} does not sign {version.name}@{version.number}: {'; '.join(problems[:5])}",
                             hint="sign the version directory (`mreg resolve NAME@N --physical`); nothing was kept")
    return _keep(store, version, bundle, signer, "import")


def _keep(store: LocalStore, version: Version, bundle: dict[str, Any], signer: str | None,
          origin: Literal["sign", "import"]) -> SignatureRecord:
    method, key_id, subject = _material(_read_bundle(bundle))
    who = provenance.now()
    record = SignatureRecord(name=version.name, version=version.number, manifest_sha256=version.manifest_sha256,
                             method=method, key_id=key_id, signer=signer or subject or f"{who.user}@{who.host}",
                             at=who.at, by=who, origin=origin, bundle=bundle)
    write_record(store, record)
    return record


def write_record(store: LocalStore, record: SignatureRecord) -> Path:
    """Add a record beside its version (a new file; existing records are never changed)."""
    if not layout.NAME_RE.match(record.name):
        raise IntegrityError(f"a signature record names the model {record.name!r}", hint="nothing was written")
    d = layout.signatures_dir(store.root, record.name, record.version)
    d.mkdir(parents=True, exist_ok=True)
    path = d / record_name(record)
    if not path.exists():
        atomic.write_bytes(path, record_bytes(record), mode=0o444)
    return path


def record_name(record: SignatureRecord) -> str:
    """The record's file name (the same key in an S3 store)."""
    stamp = record.at.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return layout.signature_record_name(stamp, record.key_id)


def record_bytes(record: SignatureRecord) -> bytes:
    """The exact bytes of a record file."""
    return record.model_dump_json(indent=2).encode()


def _read_bundle(bundle: dict[str, Any]) -> Any:
    """model-signing's Signature from a bundle dict, adjusted as its own reader adjusts a file."""
    sigstore_pb = _ms()[4]  # first: without model-signing, its dependencies are missing too
    from sigstore_models.bundle import v1 as bundle_pb

    d = copy.deepcopy(bundle)
    material = d["verificationMaterial"]
    material.setdefault("tlogEntries", [])
    if "publicKey" in material:
        material["publicKey"].setdefault("hint", None)
        for k in ("rawBytes", "keyDetails"):
            material["publicKey"].pop(k, None)
    return sigstore_pb.Signature(bundle_pb.Bundle.from_dict(d))


def _material(sig: Any) -> tuple[Literal["key", "certificate"], str, str | None]:
    """(method, key id, certificate subject) of a bundle; the key id is the sha256 of the public key's PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    vm = sig.bundle.verification_material
    chain = getattr(vm, "x509_certificate_chain", None)
    if chain is not None and chain.certificates:
        cert = x509.load_der_x509_certificate(chain.certificates[0].raw_bytes)
        pem = cert.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
        return "certificate", hashlib.sha256(pem).hexdigest(), cert.subject.rfc4514_string()
    hint = vm.public_key.hint if vm.public_key is not None else None
    if not hint:
        raise ValueError("the bundle names no public key (a pre-1.0 model-signing signature): re-sign it")
    return "key", str(hint), None


def bundle_material(bundle: dict[str, Any]) -> tuple[Literal["key", "certificate"], str, str | None]:
    """(method, key id, certificate subject) of a bundle; ValueError, KeyError or TypeError when it does not parse."""
    return _material(_read_bundle(bundle))


def key_id(public_key_pem: Path) -> str:
    """The key id model-signing gives a public key: sha256 of its PEM (SubjectPublicKeyInfo) encoding."""
    from cryptography.hazmat.primitives import serialization

    pem_bytes = read_input(public_key_pem, "trusted key", limit=1 << 20,  # a PEM key is a few hundred bytes
                           hint="give PEM elliptic-curve public keys in the trust policy")
    key = serialization.load_pem_public_key(pem_bytes)
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def identities(cert: Any) -> set[str]:
    """The names a signing certificate carries: subject CN and e-mail, and its subject alternative names."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    names = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    names |= {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.EMAIL_ADDRESS)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names |= {str(n.value) for n in san}
    except x509.ExtensionNotFound:
        pass
    return names


def judge(record: SignatureRecord, version: Version, policy: TrustPolicy, files: Path | None = None,
          now: dt.datetime | None = None) -> SignatureResult:
    """Valid, invalid (why) or untrusted: the bundle's signature checked with a trusted key or root, its
    statement against the version's manifest, and with `files` (a local version directory) against the bytes."""
    if record.name != version.name or record.version != version.number:
        return SignatureResult(record, "invalid", f"the record is for {record.name}@{record.version}")
    try:
        sig = _read_bundle(record.bundle)
        method, kid, _ = _material(sig)
    except (ValueError, KeyError, TypeError) as e:
        return SignatureResult(record, "invalid", f"the bundle does not parse: {e}")
    if kid != record.key_id or method != record.method:
        return SignatureResult(record, "invalid", "the record's key id does not match its bundle")
    verdict = _verify_key(sig, kid, policy) if method == "key" else _verify_certificate(sig, policy, now)
    if isinstance(verdict, _Refused):
        return SignatureResult(record, verdict.status, verdict.reason)
    ms_manifest, trusted_by = verdict
    try:
        signed = _digests(ms_manifest)
    except ValueError as e:
        return SignatureResult(record, "invalid", str(e))
    problems = _differences(signed, expected_files(version), "in the manifest")
    if not problems and files is not None:
        try:
            problems = _differences(signed, _digests(_hash_files(files, signed)), "on disk")
        except (OSError, ValueError) as e:
            problems = [f"the files cannot be hashed: {e}"]
    if problems:
        return SignatureResult(record, "invalid", "; ".join(problems[:5]), trusted_by)
    return SignatureResult(record, "valid", f"signed by a key {trusted_by} trusts", trusted_by)


def _verify_key(sig: Any, kid: str, policy: TrustPolicy) -> _Refused | tuple[Any, str]:
    sign_ec_key = _ms()[2]
    for path in policy.keys:
        try:
            if key_id(path) != kid:
                continue
            verifier = sign_ec_key.Verifier(path)
        except (OSError, ValueError) as e:
            raise UsageError(f"trusted key {path} ({policy.origin}) cannot be read: {e}",
                             hint="give PEM elliptic-curve public keys in the trust policy") from e
        try:
            return verifier.verify(sig), f"{policy.origin} key {path.name}"
        except Exception as e:  # noqa: BLE001 - cryptography's InvalidSignature, ValueError, KeyError
            return _Refused("invalid", f"the signature does not verify with {path.name} "
                                   f"({type(e).__name__})")
    return _Refused("untrusted", f"key {kid[:12]}… is not trusted by {policy.describe()}")


def _verify_certificate(sig: Any, policy: TrustPolicy, now: dt.datetime | None) -> _Refused | tuple[Any, str]:
    from cryptography import x509

    sign_certificate = _ms()[3]
    cert = x509.load_der_x509_certificate(sig.bundle.verification_material.x509_certificate_chain.certificates[0]
                                          .raw_bytes)
    who = identities(cert)
    now = now or dt.datetime.now(dt.timezone.utc)
    # model-signing checks the chain at the certificate's start of validity (there is no trusted time of
    # signing offline); mreg also refuses one that has expired by now.
    if cert.not_valid_after_utc < now:
        return _Refused("invalid", f"the signing certificate {cert.subject.rfc4514_string()} "
                               f"expired on {cert.not_valid_after_utc.isoformat()}")
    chained = False
    for root in policy.roots:
        try:
            check_input(root.cert, "trusted root", limit=1 << 20,  # model-signing reads it: a regular PEM file
                        hint="give PEM CA certificates as roots in the trust policy")
            verifier = sign_certificate.Verifier([root.cert])
        except (OSError, ValueError) as e:
            raise UsageError(f"trusted root {root.cert} ({policy.origin}) cannot be read: {e}",
                             hint="give PEM CA certificates in the trust policy") from e
        try:
            verifier._verify_certificates(sig.bundle.verification_material)
        except Exception:  # noqa: BLE001 - OpenSSL's X509StoreContextError: this root did not issue it
            continue
        chained = True
        if root.identities and not who & set(root.identities):
            continue
        try:
            return verifier.verify(sig), f"{policy.origin} root {root.cert.name}"
        except Exception as e:  # noqa: BLE001 - InvalidSignature, ValueError
            return _Refused("invalid", f"the signature does not verify with its certificate "
                                   f"({type(e).__name__})")
    why = (f"{', '.join(sorted(who))} is not an identity its root may sign for" if chained
           else f"certificate {cert.subject.rfc4514_string()} chains to no trusted root")
    return _Refused("untrusted", f"{why} ({policy.describe()})")


def signature_problems(results: Iterable[SignatureResult], version: Version, policy: TrustPolicy) -> list[str]:
    """Why a version fails a `signature` requirement (empty when at least one signature is valid)."""
    results = list(results)
    what = f"{version.name}@{version.number}"
    if policy.empty:
        return [f"signature: {what} must be signed, but no trust policy is configured ([trust] keys or roots)"]
    if any(r.status == "valid" for r in results):
        return []
    if not results:
        return [f"signature: {what} is not signed (policy {policy.describe()}; "
                f"run `mreg sign {what} --key KEY.pem`)"]
    found = "; ".join(f"{r.record.signer} (key {r.record.key_id[:12]}…): {r.status}, {r.reason}" for r in results)
    return [f"signature: no signature of {what} verifies against {policy.describe()}: {found}"]



def record_doc(rec: SignatureRecord) -> dict[str, Any]:
    """A signature record without its bundle (what `show`, `sign` and the web view report)."""
    return {"signer": rec.signer, "method": rec.method, "key_id": rec.key_id, "at": rec.at.isoformat(),
            "origin": rec.origin, "manifest_sha256": rec.manifest_sha256,
            "by": f"{rec.by.user}@{rec.by.host}"}


def result_doc(res: SignatureResult) -> dict[str, Any]:
    """A verdict on one signature, as a document."""
    return {**record_doc(res.record), "status": res.status, "reason": res.reason, "trusted_by": res.trusted_by}


def shown(store: Store, version: Version, policy: TrustPolicy) -> list[dict[str, Any]]:
    """What `show` lists: each signature judged against the manifest (the bytes are `verify`'s job); where
    model-signing is not installed (a serving node with the core only), the records, `unchecked`."""
    records = store.signatures(version.name, version.number)
    try:
        return [result_doc(judge(r, version, policy)) for r in records]
    except UsageError as e:
        why = f"{e}; {e.hint}" if e.hint else str(e)
        return [{**record_doc(r), "status": "unchecked", "reason": why, "trusted_by": None} for r in records]
