"""Signatures over OCI: each record a referrer of the model's manifest, judged before a sync downloads anything.

Against a real CNCF distribution registry 2.8 on loopback (it has no referrers API, so this is the
referrers tag schema: an image index under `sha256-<hex>`), OCI image layouts, and skopeo reading
and copying what mreg wrote.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry
from support.pki import KeyPair, write_key
from support.tiny_models import write_random_safetensors

from registry.oci import media

pytest.importorskip("model_signing", reason="signing needs model-signing: pip install 'mreg[sign]'")


@pytest.fixture
def repo(registry: LocalRegistry, request: pytest.FixtureRequest) -> str:
    """A fresh repository, as HOST/REPO (no scheme: skopeo's docker:// and mreg's oci:// both take it)."""
    return f"{registry.host}/sig/{request.node.name.lower().replace('_', '-')}"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, KeyPair]:
    """The release key a node trusts, and a stranger's."""
    return {n: write_key(tmp_path / "pki", n)[0] for n in ("release", "stranger")}


def _trust(isolated: Path, text: str) -> None:
    path = isolated / "home" / ".config" / "mreg" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _keys_table(table: str, *pairs: KeyPair) -> str:
    return f"[{table}]\nkeys = {json.dumps([str(p.public) for p in pairs])}\n"


def _version(mreg: Any, tmp_path: Path, seed: int, key: KeyPair | None = None, signer: str = "release-bot") -> str:
    """Model m, one more version (a real conversion of a tiny model), signed with `key` when given."""
    src = tmp_path / f"src{seed}"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    write_random_safetensors(src / "model.safetensors", 1 << 14, seed)
    ref = f"m@{ok(mreg('convert', src, '--to', 'hf', '--name', 'm', '--json'))['version']}"
    if key is not None:
        ok(mreg("sign", ref, "--key", key.private, "--signer", signer, "--json"))
    return ref


def _skopeo_raw(ref: str) -> Any:
    out = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def _skopeo_copy(*args: str) -> None:
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", *args], check=True, capture_output=True,
                   timeout=60)


def _untouched(node: Path) -> bool:
    """Nothing of the model in a node's store, and no blob downloaded."""
    return not (node / "models" / "m").exists() and not any(p.is_file() for p in (node / "blobs").rglob("*"))


def test_signatures_travel_as_referrers_and_a_trusted_node_keeps_them(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, store_root: Path, keys: dict[str, KeyPair]) -> None:
    ref = _version(mreg, tmp_path, 0, keys["release"])
    pushed = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))
    assert pushed["signatures"] == 1 and pushed["uploaded_blobs"] == 4
    again = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))
    assert again["reused"] and again["signatures"] == 0, "a record already listed is not sent again"

    # distribution 2.8 has no referrers API: the list is the index under the referrers tag schema, read by skopeo.
    index = _skopeo_raw(f"{repo}:{pushed['digest'].replace(':', '-')}")
    assert index["mediaType"] == media.OCI_INDEX and index["schemaVersion"] == 2
    [entry] = index["manifests"]
    assert entry["artifactType"] == media.SIGSTORE_BUNDLE and entry["mediaType"] == media.OCI_MANIFEST
    [record_file] = (store_root / "models/m/signatures/1").glob("*.json")
    record = json.loads(record_file.read_text())
    notes = entry["annotations"]
    assert notes[media.SIG_SIGNER] == "release-bot" and notes[media.SIG_KEY_ID] == record["key_id"]
    assert notes[media.CREATED].startswith(record["at"][:19])
    referrer = _skopeo_raw(f"{repo}@{entry['digest']}")
    assert referrer["subject"] == {"mediaType": media.OCI_MANIFEST, "digest": pushed["digest"],
                                   "size": referrer["subject"]["size"]}
    assert referrer["artifactType"] == media.SIGSTORE_BUNDLE and referrer["config"]["mediaType"] == media.OCI_EMPTY
    assert [layer["mediaType"] for layer in referrer["layers"]] == [media.SIGSTORE_BUNDLE]
    # A signature added later travels with the next push of the same tag (also what a push killed before its
    # referrers needs); the list grows by one.
    ok(mreg("sign", ref, "--key", keys["stranger"].private, "--signer", "mallory", "--json"))
    later = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))
    assert later["reused"] and later["uploaded_blobs"] == 0 and later["signatures"] == 1
    assert len(_skopeo_raw(f"{repo}:{pushed['digest'].replace(':', '-')}")["manifests"]) == 2

    _trust(isolated, _keys_table("trust", keys["release"]))
    node = tmp_path / "node"
    synced = ok(mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json"))
    assert synced["version"] == 1 and synced["signatures"] == 1 and synced["changed"]
    [copied] = (node / "models/m/signatures/1").glob("*.json")  # the valid one: mallory's is not kept
    assert copied.read_bytes() == record_file.read_bytes(), "the record is rebuilt byte for byte"
    assert ok(mreg("verify", "m@1", "--signatures", "--store", node, "--json"))["versions"][0]["signed"]
    assert ok(mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json"))["changed"] is False
    assert len(list((node / "models/m/signatures/1").glob("*.json"))) == 1


def test_a_node_refuses_unsigned_untrusted_and_tampered_versions(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, store_root: Path, registry: LocalRegistry,
        keys: dict[str, KeyPair]) -> None:
    """Exit 6 before any layer is downloaded, naming the signer found and the policy missed; nothing written."""
    unsigned = _version(mreg, tmp_path, 1)
    mallory = _version(mreg, tmp_path, 2, keys["stranger"], signer="mallory")
    damaged = _version(mreg, tmp_path, 3, keys["release"])
    forged = _version(mreg, tmp_path, 4, keys["release"])
    # A forged record: the release key's signature over m@4, its DSSE signature bytes changed.
    [genuine] = (store_root / "models/m/signatures/4").glob("*.json")
    doc = json.loads(genuine.read_text())
    sig = doc["bundle"]["dsseEnvelope"]["signatures"][0]
    sig["sig"] = ("A" if sig["sig"][0] != "A" else "B") + sig["sig"][1:]
    genuine.chmod(0o644)
    genuine.write_text(json.dumps(doc))
    pushed = {r: ok(mreg("push", r, f"oci://{repo}:{r[2:]}", "--insecure", "--json"))
              for r in (unsigned, mallory, damaged, forged)}
    assert [p["signatures"] for p in pushed.values()] == [0, 1, 1, 1]
    # m@3's bundle, changed on the registry's disk (the digest no longer matches).
    index = _skopeo_raw(f"{repo}:{pushed[damaged]['digest'].replace(':', '-')}")
    bundle_digest = _skopeo_raw(f"{repo}@{index['manifests'][0]['digest']}")["layers"][0]["digest"]
    blob = registry.blob_file(bundle_digest)
    original = blob.read_bytes()
    blob.write_bytes(original.replace(b'"sig":"', b'"sig":"X', 1))

    _trust(isolated, _keys_table("trust", keys["release"]))
    node = tmp_path / "node"
    try:
        for r, says in ((unsigned, "is not signed"), (mallory, "mallory (key"),
                        (damaged, "does not match its digest"), (forged, "does not verify")):
            refused = mreg("sync", f"oci://{repo}:{r[2:]}", "--insecure", "--store", node, "--json")
            assert refused.exit_code == 6, refused.stdout
            error = refused.json["error"]
            assert error["type"] == "GateRefused" and says in error["message"], error
            assert "[trust]: key release.pub" in error["message"] and error["hint"]
            assert _untouched(node), f"{r}: nothing downloaded, no alias"
    finally:
        blob.write_bytes(original)
    # `mreg pull` fills the cache with source files and ignores signatures, policy or not.
    assert ok(mreg("pull", f"oci://{repo}:1", "--insecure", "--json"))["files"] == 2
    # With the bundle restored, the version that was only damaged syncs.
    assert ok(mreg("sync", f"oci://{repo}:3", "--insecure", "--store", node, "--json"))["signatures"] == 1


def test_a_models_own_trust_table_replaces_the_global_one(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, keys: dict[str, KeyPair]) -> None:
    """The policy is the one of the model the artifact names (no NAME given: read from its mreg manifest)."""
    ref = _version(mreg, tmp_path, 0, keys["stranger"], signer="mallory")
    ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))
    node = tmp_path / "node"
    _trust(isolated, _keys_table("trust", keys["stranger"]) + _keys_table("models.m.trust", keys["release"]))
    refused = mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json")
    assert refused.exit_code == 6 and "[models.m.trust]: key release.pub" in refused.json["error"]["message"]
    assert _untouched(node)
    _trust(isolated, _keys_table("trust", keys["release"]) + _keys_table("models.m.trust", keys["stranger"]))
    assert ok(mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json"))["signatures"] == 1
    _trust(isolated, _keys_table("models.other.trust", keys["release"]))  # no policy for m: not judged
    assert ok(mreg("sync", f"oci://{repo}:v1", "m", "--insecure", "--store", tmp_path / "n2", "--json"))["version"]


def test_signatures_in_layouts_pushed_by_mreg_and_copied_by_skopeo(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, keys: dict[str, KeyPair]) -> None:
    ref = _version(mreg, tmp_path, 0, keys["release"])
    carry = tmp_path / "carry"
    assert ok(mreg("push", ref, f"oci-layout:{carry}:v1", "--json"))["signatures"] == 1
    assert ok(mreg("push", ref, f"oci-layout:{carry}:v1", "--json"))["signatures"] == 0
    entries = json.loads((carry / "index.json").read_text())["manifests"]
    assert [e.get("artifactType") for e in entries] == [None, media.SIGSTORE_BUNDLE], "listed in index.json once"
    assert media.REF_NAME not in entries[1]["annotations"], "a referrer is not a tag"
    _trust(isolated, _keys_table("trust", keys["release"]))
    # Without :TAG the layout still holds one artifact: its signature does not count as another.
    assert ok(mreg("sync", f"oci-layout:{carry}", "--store", tmp_path / "n1", "--json"))["signatures"] == 1

    # skopeo 1.9 copies the model without its referrers; copying the sha256-<hex> tag (--all) carries them.
    pushed = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))
    copied = tmp_path / "copied"
    _skopeo_copy(f"docker://{repo}:v1", f"oci:{copied}:v1")
    refused = mreg("sync", f"oci-layout:{copied}:v1", "--store", tmp_path / "n2", "--json")
    assert refused.exit_code == 6 and "is not signed" in refused.json["error"]["message"]
    tag = pushed["digest"].replace(":", "-")
    _skopeo_copy("--all", f"docker://{repo}:{tag}", f"oci:{copied}:{tag}")
    synced = ok(mreg("sync", f"oci-layout:{copied}:v1", "--store", tmp_path / "n2", "--json"))
    assert synced["version"] == 1 and synced["signatures"] == 1


def test_signatures_travel_in_archives_and_with_images(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, keys: dict[str, KeyPair]) -> None:
    """An oci-archive carries its referrers in its index (the archive rewritten once per new record), and an
    image pushed with --as-image is signed as the image: a node under a policy syncs both, and refuses the
    unsigned image."""
    ref = _version(mreg, tmp_path, 0, keys["release"])
    tar = tmp_path / "carry.tar"
    assert ok(mreg("push", ref, f"oci-archive:{tar}:v1", "--json"))["signatures"] == 1
    assert ok(mreg("push", ref, f"oci-archive:{tar}:v1", "--json"))["signatures"] == 0
    _trust(isolated, _keys_table("trust", keys["release"]))
    assert ok(mreg("sync", f"oci-archive:{tar}:v1", "--store", tmp_path / "n1", "--json"))["signatures"] == 1
    assert ok(mreg("sync", f"oci-archive:{tar}", "--store", tmp_path / "n1b", "--json"))["signatures"] == 1

    image = ok(mreg("push", ref, f"oci://{repo}:img", "--as-image", "--insecure", "--json"))
    assert image["signatures"] == 1
    synced = ok(mreg("sync", f"oci://{repo}:img", "--insecure", "--store", tmp_path / "n2", "--json"))
    assert synced["version"] == 1 and synced["signatures"] == 1
    unsigned = _version(mreg, tmp_path, 1)
    ok(mreg("push", unsigned, f"oci://{repo}:img2", "--as-image", "--insecure", "--json"))
    refused = mreg("sync", f"oci://{repo}:img2", "--insecure", "--store", tmp_path / "n3", "--json")
    assert refused.exit_code == 6 and "is not signed" in refused.json["error"]["message"]
    assert _untouched(tmp_path / "n3")


def test_a_referrers_tag_that_is_not_an_index_is_left_alone(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, keys: dict[str, KeyPair]) -> None:
    """The tag-schema name taken by something else: a push refuses to overwrite it (exit 5), a sync reads no
    referrers from it (so a policy refuses the version), and the tag still names what it named."""
    ref = _version(mreg, tmp_path, 0)
    digest = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))["digest"]
    tag = digest.replace(":", "-")
    ok(mreg("push", ref, f"oci://{repo}:{tag}", "--insecure", "--json"))  # the model itself under that name
    ok(mreg("sign", ref, "--key", keys["release"].private, "--json"))
    refused = mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json")
    assert refused.exit_code == 5 and "not an image index" in refused.json["error"]["message"], refused.stdout
    assert _skopeo_raw(f"{repo}:{tag}")["artifactType"] == media.MODEL_ARTIFACT
    _trust(isolated, _keys_table("trust", keys["release"]))
    node = tmp_path / "node"
    r = mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json")
    assert r.exit_code == 6 and "is not signed" in r.json["error"]["message"] and _untouched(node)


def _model_signing(*args: str | Path) -> None:
    r = subprocess.run([sys.executable, "-m", "model_signing", *map(str, args)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_bundles_on_the_registry_interoperate_with_the_model_signing_cli(
        mreg: Any, tmp_path: Path, repo: str, isolated: Path, store_root: Path, registry: LocalRegistry,
        keys: dict[str, KeyPair]) -> None:
    from registry.oci.reference import LayoutRef, parse
    from registry.oci.registry import RegistryTarget

    ref = _version(mreg, tmp_path, 0, keys["release"])
    digest = ok(mreg("push", ref, f"oci://{repo}:v1", "--insecure", "--json"))["digest"]
    vdir = store_root / "models/m/versions/1"
    # mreg → model_signing: the referrer's layer, as the registry holds it, is the file `model_signing verify` takes.
    [entry] = _skopeo_raw(f"{repo}:{digest.replace(':', '-')}")["manifests"]
    layer = _skopeo_raw(f"{repo}@{entry['digest']}")["layers"][0]["digest"]
    sig = tmp_path / "from-registry.sig"
    sig.write_bytes(registry.blob_file(layer).read_bytes())
    _model_signing("verify", "key", "--signature", sig, "--public_key", keys["release"].public, vdir)

    # model_signing → mreg: its CLI signs the version directory, another tool attaches the bundle (as
    # `oras attach --artifact-type application/vnd.dev.sigstore.bundle.v0.3+json` does: no mreg annotations).
    ops, _ = write_key(tmp_path / "pki", "ops")
    made = tmp_path / "cli.sig"
    _model_signing("sign", "key", "--signature", made, "--private_key", ops.private, vdir)
    (tmp_path / "empty").write_bytes(media.EMPTY_DATA)
    bundle = made.read_bytes()
    bundle_digest = "sha256:" + hashlib.sha256(bundle).hexdigest()
    subject = _skopeo_raw(f"{repo}:v1")
    oci_ref = parse(f"oci://{repo}")
    assert not isinstance(oci_ref, LayoutRef)
    with RegistryTarget(oci_ref, insecure=True) as target:
        target.upload_blob(media.EMPTY_DIGEST, 2, tmp_path / "empty", lambda _n: None)
        target.upload_blob(bundle_digest, len(bundle), made, lambda _n: None)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": media.OCI_MANIFEST, "artifactType": media.SIGSTORE_BUNDLE,
            "config": {"mediaType": media.OCI_EMPTY, "digest": media.EMPTY_DIGEST, "size": 2},
            "layers": [{"mediaType": media.SIGSTORE_BUNDLE, "digest": bundle_digest, "size": len(bundle)}],
            "subject": {"mediaType": media.OCI_MANIFEST, "digest": digest,
                        "size": len(json.dumps(subject, separators=(",", ":")))},
            "annotations": {media.CREATED: "2026-01-02T03:04:05Z"}}).encode()
        target.put_referrer(manifest, media.OCI_MANIFEST, digest)
    assert len(_skopeo_raw(f"{repo}:{digest.replace(':', '-')}")["manifests"]) == 2
    _trust(isolated, _keys_table("trust", ops))
    node = tmp_path / "node"
    assert ok(mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", node, "--json"))["signatures"] == 1
    [shown] = ok(mreg("show", "m@1", "--store", node, "--json"))["signatures"]
    assert shown["status"] == "valid" and shown["origin"] == "import" and shown["signer"].startswith("key ")
    assert shown["at"].startswith("2026-01-02T03:04:05")
