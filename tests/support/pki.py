"""Elliptic-curve keys and a small CA (root → leaf with code-signing usage), written as PEM files for signing tests."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    """A private key file and its public key file."""

    private: Path
    public: Path


def write_key(dest: Path, name: str) -> tuple[KeyPair, ec.EllipticCurvePrivateKey]:
    """A fresh P-256 key as `name.key` (PKCS#8) and `name.pub` (SubjectPublicKeyInfo)."""
    dest.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = dest / f"{name}.key", dest / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return KeyPair(priv, pub), key


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def write_ca(dest: Path, name: str = "ca") -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed root CA certificate `name.pem`; returns (path, its key, the certificate)."""
    _, key = write_key(dest, name)
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(f"mreg test {name}")).issuer_name(_name(f"mreg test {name}"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=30)).not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = dest / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def write_leaf(dest: Path, name: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, *,
               email: str, expired: bool = False) -> tuple[KeyPair, Path]:
    """A signing key and its certificate `name.pem` issued by the CA (valid now, or expired a day ago)."""
    pair, key = write_key(dest, name)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = (now - dt.timedelta(days=60), now - dt.timedelta(days=1)) if expired else (
        now - dt.timedelta(days=1), now + dt.timedelta(days=365))
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    path = dest / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair, path
