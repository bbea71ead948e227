"""Signed versions: mreg sign, verify --signatures against a trust policy, tampering, certificates, the gate."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.pki import KeyPair, write_ca, write_key, write_leaf

from registry import layout


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    """A release key, a stranger's key, a CA with a valid and an expired leaf."""
    d = tmp_path / "pki"
    release, _ = write_key(d, "release")
    stranger, _ = write_key(d, "stranger")
    ca, ca_key, ca_cert = write_ca(d)
    leaf, leaf_cert = write_leaf(d, "ci", ca_key, ca_cert, email="ci@example.com")
    old, old_cert = write_leaf(d, "old", ca_key, ca_cert, email="ci@example.com", expired=True)
    return {"release": release, "stranger": stranger, "ca": ca, "leaf": leaf, "leaf_cert": leaf_cert,
            "old": old, "old_cert": old_cert, "dir": d}


def write_config(home: Path, text: str) -> Path:
    """The default config file (XDG_CONFIG_HOME points into tmp_path)."""
    path = home / ".config" / "mreg" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def version(mreg: Any, model_dir: Path) -> str:
    """Model `m`, version 1."""
    ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    return "m@1"


def trust_keys(isolated: Path, *keys: KeyPair, table: str = "trust") -> None:
    """A config file trusting these public keys."""
    write_config(isolated / "home", f"[{table}]\nkeys = {json.dumps([str(k.public) for k in keys])}\n")


def test_sign_and_verify_with_a_trusted_key(mreg: Any, version: str, pki: dict[str, Any], isolated: Path,
                                            store_root: Path) -> None:
    vdir = store_root / "models/m/versions/1"
    before = sorted(p.relative_to(vdir).as_posix() for p in vdir.rglob("*"))
    doc = ok(mreg("sign", version, "--key", pki["release"].private, "--signer", "release-bot", "--json"))
    assert doc["method"] == "key" and doc["signer"] == "release-bot" and len(doc["key_id"]) == 64
    assert sorted(p.relative_to(vdir).as_posix() for p in vdir.rglob("*")) == before, "the version is not touched"
    [rec] = (store_root / "models/m/signatures/1").glob("*.json")
    assert rec.stat().st_mode & 0o222 == 0, "records are read-only"

    r = mreg("verify", version, "--signatures", "--json")
    assert r.exit_code == 4 and r.json["versions"][0]["signatures"][0]["status"] == "untrusted", "no policy yet"
    trust_keys(isolated, pki["release"])
    doc = ok(mreg("verify", version, "--signatures", "--json"))
    [sig] = doc["versions"][0]["signatures"]
    assert doc["ok"] and sig["status"] == "valid" and sig["signer"] == "release-bot"
    shown = ok(mreg("show", version, "--json"))["signatures"]
    assert [s["status"] for s in shown] == ["valid"]
    assert "release-bot" in mreg("show", version).stdout


def test_several_signers_and_an_untrusted_one(mreg: Any, version: str, pki: dict[str, Any], isolated: Path) -> None:
    ok(mreg("sign", version, "--key", pki["release"].private, "--json"))
    ok(mreg("sign", version, "--key", pki["stranger"].private, "--signer", "mallory", "--json"))
    trust_keys(isolated, pki["release"])
    doc = ok(mreg("verify", version, "--signatures", "--json"))  # one valid signature is enough; the other is named
    statuses = sorted(s["status"] for s in doc["versions"][0]["signatures"])
    assert statuses == ["untrusted", "valid"]
    mallory = next(s for s in doc["versions"][0]["signatures"] if s["signer"] == "mallory")
    assert "not trusted" in mallory["reason"]


def test_tampered_file_manifest_and_signature_are_invalid(mreg: Any, version: str, pki: dict[str, Any],
                                                          isolated: Path, store_root: Path) -> None:
    ok(mreg("sign", version, "--key", pki["release"].private, "--json"))
    trust_keys(isolated, pki["release"])
    [rec] = (store_root / "models/m/signatures/1").glob("*.json")

    # The signature: one byte of the DSSE signature changed.
    original = rec.read_bytes()
    doc = json.loads(original)
    sig = doc["bundle"]["dsseEnvelope"]["signatures"][0]["sig"]
    doc["bundle"]["dsseEnvelope"]["signatures"][0]["sig"] = ("B" if sig[5] != "B" else "C").join((sig[:5], sig[6:]))
    os.chmod(rec, 0o644)
    rec.write_text(json.dumps(doc))
    r = mreg("verify", version, "--signatures", "--json")
    assert r.exit_code == 4 and r.json["versions"][0]["signatures"][0]["status"] == "invalid"
    assert r.json["error"]["type"] == "IntegrityError" and r.json["error"]["exit_code"] == 4
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "does not verify" in r.json["error"]["message"]
    rec.write_bytes(original)
    ok(mreg("verify", version, "--signatures", "--json"))

    # A file of the version (the store's blob, hard-linked): promotion re-hashes and refuses.
    f = store_root / "models/m/versions/1/hf/config.json"
    saved = f.read_bytes()
    os.chmod(f, 0o644)
    f.write_bytes(b'{"model_type": "evil"}')
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "config.json" in r.json["error"]["message"]
    assert not (store_root / "models/m/production").exists(), "nothing flipped"
    f.write_bytes(saved)

    # The manifest: another signed statement no longer matches it.
    m = store_root / "models/m/versions/1" / layout.MANIFEST
    saved = m.read_bytes()
    os.chmod(m, 0o644)
    m.write_bytes(saved.replace(b'"user": "', b'"user": "x'))
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "manifest.json" in r.json["error"]["message"]
    assert not (store_root / "models/m/production").exists()
    m.write_bytes(saved)
    assert ok(mreg("promote", version, "--require", "signature", "--json"))["to"] == 1


def test_promotion_gate_unsigned_untrusted_and_removed_key(mreg: Any, version: str, pki: dict[str, Any],
                                                           isolated: Path, store_root: Path) -> None:
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "no trust policy" in r.json["error"]["message"]
    trust_keys(isolated, pki["release"])
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "is not signed" in r.json["error"]["message"]
    ok(mreg("sign", version, "--key", pki["stranger"].private, "--signer", "mallory", "--json"))
    r = mreg("promote", version, "--require", "signature", "--json")
    msg = r.json["error"]["message"]
    assert r.exit_code == 6 and "mallory" in msg and "release.pub" in msg, "names the signer and the policy"
    assert not (store_root / "models/m/production").exists(), "nothing flipped"
    ok(mreg("sign", version, "--key", pki["release"].private, "--json"))
    # [models.m] require = ["signature"]: the gate without the flag. The release key removed from the policy: refused.
    ops, _ = write_key(pki["dir"], "ops")
    write_config(isolated / "home", f'[models.m]\nrequire = ["signature"]\n[models.m.trust]\nkeys = ["{ops.public}"]\n')
    r = mreg("promote", version, "--json")
    assert r.exit_code == 6 and "[models.m.trust]: key ops.pub" in r.json["error"]["message"]
    # A trusted key that is not there is a configuration error, named; relative paths: the config file's directory.
    cfg = write_config(isolated / "home",
                       '[models.m]\nrequire = ["signature"]\n[models.m.trust]\nkeys = ["release.pub"]\n')
    r = mreg("promote", version, "--json")
    assert r.exit_code == 2 and str(cfg.parent / "release.pub") in r.json["error"]["message"]
    (cfg.parent / "release.pub").write_bytes(pki["release"].public.read_bytes())
    assert ok(mreg("promote", version, "--json"))["to"] == 1
    # A model's own table replaces [trust]: an empty one trusts nothing.
    write_config(isolated / "home", f'[models.m]\nrequire = ["signature"]\n'
                                    f'[trust]\nkeys = ["{pki["release"].public}"]\n[models.m.trust]\nkeys = []\n')
    r = mreg("promote", version, "--alias", "staging", "--json")
    assert r.exit_code == 6 and not (store_root / "models/m/staging").exists()


def test_certificate_signatures(mreg: Any, version: str, pki: dict[str, Any], isolated: Path) -> None:
    doc = ok(mreg("sign", version, "--key", pki["leaf"].private, "--certificate", pki["leaf_cert"],
                  "--chain", pki["ca"], "--json"))
    assert doc["method"] == "certificate" and doc["signer"] == "CN=ci"
    write_config(isolated / "home",
                 f'[trust]\nroots = [{{ cert = "{pki["ca"]}", identities = ["ops@example.com"] }}]\n')
    r = mreg("verify", version, "--signatures", "--json")
    [sig] = r.json["versions"][0]["signatures"]
    assert r.exit_code == 4 and sig["status"] == "untrusted" and "identity" in sig["reason"]
    write_config(isolated / "home", f'[trust]\nroots = [{{ cert = "{pki["ca"]}", identities = ["ci@example.com"] }}]\n')
    assert ok(mreg("verify", version, "--signatures", "--json"))["versions"][0]["signatures"][0]["status"] == "valid"
    # A root that did not issue the certificate: untrusted.
    other, _, _ = write_ca(pki["dir"], "other-ca")
    write_config(isolated / "home", f'[trust]\nroots = ["{other}"]\n')
    sig = mreg("verify", version, "--signatures", "--json").json["versions"][0]["signatures"][0]
    assert sig["status"] == "untrusted" and "chains to no trusted root" in sig["reason"]


def test_expired_certificate_is_refused(mreg: Any, version: str, pki: dict[str, Any], isolated: Path,
                                        store_root: Path) -> None:
    ok(mreg("sign", version, "--key", pki["old"].private, "--certificate", pki["old_cert"], "--chain", pki["ca"],
            "--json"))
    write_config(isolated / "home", f'[trust]\nroots = ["{pki["ca"]}"]\n')
    sig = mreg("verify", version, "--signatures", "--json").json["versions"][0]["signatures"][0]
    assert sig["status"] == "invalid" and "expired" in sig["reason"]
    r = mreg("promote", version, "--require", "signature", "--json")
    assert r.exit_code == 6 and "expired" in r.json["error"]["message"]
    assert not (store_root / "models/m/production").exists()


def test_sign_refuses_a_damaged_version_and_bad_input(mreg: Any, version: str, pki: dict[str, Any],
                                                      store_root: Path) -> None:
    f = store_root / "models/m/versions/1/hf/config.json"
    os.chmod(f, 0o644)
    saved = f.read_bytes()
    f.write_bytes(b"{}")
    r = mreg("sign", version, "--key", pki["release"].private, "--json")
    assert r.exit_code == 4 and "config.json" in r.json["error"]["message"]
    assert not (store_root / "models/m/signatures").exists(), "nothing signed"
    f.write_bytes(saved)
    r = mreg("sign", version, "--key", pki["release"].public, "--json")
    assert r.exit_code == 2 and r.json["error"]["type"] == "UsageError"
    assert mreg("sign", version, "--json").exit_code == 2
    assert mreg("sign", "m@9", "--key", pki["release"].private, "--json").exit_code == 3


def test_a_signature_replayed_onto_another_version_is_invalid(mreg: Any, model_dir: Path, pki: dict[str, Any],
                                                              isolated: Path, store_root: Path) -> None:
    """A record copied beside another version (its name and number edited) signs the other manifest: invalid."""
    for i in range(2):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    ok(mreg("sign", "m@1", "--key", pki["release"].private, "--json"))
    trust_keys(isolated, pki["release"])
    [rec] = (store_root / "models/m/signatures/1").glob("*.json")
    doc = json.loads(rec.read_text())
    doc["version"] = 2
    doc["manifest_sha256"] = ok(mreg("show", "m@2", "--json"))["manifest_sha256"]
    (store_root / "models/m/signatures/2").mkdir(parents=True)
    (store_root / "models/m/signatures/2" / rec.name).write_text(json.dumps(doc))
    sig = mreg("verify", "m@2", "--signatures", "--json").json["versions"][0]["signatures"][0]
    assert sig["status"] == "invalid" and "manifest.json" in sig["reason"]
    r = mreg("promote", "m@2", "--require", "signature", "--json")
    assert r.exit_code == 6 and not (store_root / "models/m/production").exists()
    # A record whose key id is not its bundle's is invalid too, whatever the policy trusts.
    doc = json.loads(rec.read_text())
    doc["key_id"] = "0" * 64
    os.chmod(rec, 0o644)
    rec.write_text(json.dumps(doc))
    sig = mreg("verify", "m@1", "--signatures", "--json").json["versions"][0]["signatures"][0]
    assert sig["status"] == "invalid" and "key id" in sig["reason"]


def test_an_encrypted_key_takes_its_password_from_the_environment(mreg: Any, version: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = tmp_path / "locked.key"
    key.write_bytes(ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret")))
    r = mreg("sign", version, "--key", key, "--json")
    assert r.exit_code == 2 and "cannot sign" in r.json["error"]["message"]
    monkeypatch.setenv("KEY_PASSWORD", "s3cret")
    assert ok(mreg("sign", version, "--key", key, "--password-env", "KEY_PASSWORD", "--json"))["method"] == "key"


def test_show_lists_signatures_unchecked_without_model_signing(mreg: Any, version: str, pki: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving node with mreg's core only still shows what it synced; sign and the gate say what to install."""
    import sys

    ok(mreg("sign", version, "--key", pki["release"].private, "--signer", "release-bot", "--json"))
    monkeypatch.setitem(sys.modules, "model_signing", None)
    [sig] = ok(mreg("show", version, "--json"))["signatures"]
    assert sig["signer"] == "release-bot" and sig["status"] == "unchecked" and "mreg[sign]" in sig["reason"]
    r = mreg("sign", version, "--key", pki["release"].private, "--json")
    assert r.exit_code == 2 and "mreg[sign]" in r.json["error"]["hint"]
