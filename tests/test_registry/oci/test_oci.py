"""OCI registries and layouts against a real distribution registry on loopback, read back by skopeo."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry, killed_push, need_binaries
from support.tiny_models import write_random_safetensors

from registry.oci import media

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(registry: LocalRegistry, request: pytest.FixtureRequest) -> str:
    """A fresh repository, as oci://HOST/REPO."""
    return f"oci://{registry.host}/t/{request.node.name.lower().replace('_', '-')}"


def _model(root: Path, seed: int = 0, size: int = 1 << 16) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (root / "README.md").write_text("# tiny\n")  # the same in every version: a blob shared between them
    write_random_safetensors(root / "model.safetensors", size, seed)
    return root


def _published(mreg: Any, tmp_path: Path, versions: int = 1, size: int = 1 << 16) -> None:
    for i in range(versions):
        ok(mreg("convert", _model(tmp_path / f"src{i}", i, size), "--to", "hf", "--name", "m", "--json"))


def _skopeo(*args: str) -> str:
    return subprocess.run(["skopeo", *args], check=True, capture_output=True, text=True, timeout=60).stdout


def test_push_pull_convert_sync_round_trip(mreg: Any, tmp_path: Path, repo: str, store_root: Path) -> None:
    _published(mreg, tmp_path)
    pushed = ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    assert pushed["uploaded_blobs"] == 5 and not pushed["reused"]  # 3 files, config, mreg manifest
    assert pushed["digest"].startswith("sha256:") and pushed["tag"] == "v1"
    again = ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    assert again["reused"] and again["uploaded_bytes"] == 0

    cache2 = tmp_path / "cache2"
    pulled = ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", cache2, "--json"))
    assert pulled["kind"] == "oci" and pulled["commit"] == pushed["digest"].split(":")[1]
    assert pulled["files"] == 3 and not pulled["from_cache"]
    by_digest = ok(mreg("pull", f"{repo}@{pushed['digest']}", "--insecure", "--cache-dir", cache2, "--json"))
    assert by_digest["from_cache"]
    made = ok(mreg("convert", f"{repo}:v1", "--insecure", "--cache-dir", cache2, "--to", "hf", "--name", "m2",
                   "--json"))
    assert made["verification"] == {"hf": "passed"}
    assert ok(mreg("verify", "m2@1", "--json"))["ok"]
    original = json.loads((store_root / "models/m/versions/1/manifest.json").read_text())
    copy = json.loads((store_root / "models/m2/versions/1/manifest.json").read_text())
    digests = [[f["sha256"] for f in m["artifacts"][0]["files"]] for m in (original, copy)]
    assert digests[0] == digests[1]

    store2 = tmp_path / "store2"
    synced = ok(mreg("sync", f"{repo}:v1", "--insecure", "--store", store2, "--json"))
    assert synced["name"] == "m" and synced["version"] == 1 and synced["changed"]
    assert (store2 / "models/m/versions/1/manifest.json").read_bytes() == \
        (store_root / "models/m/versions/1/manifest.json").read_bytes()
    assert os.readlink(store2 / "models/m/production") == "versions/1"
    assert ok(mreg("sync", f"{repo}:v1", "--insecure", "--store", store2, "--json"))["changed"] is False
    assert ok(mreg("verify", "m@1", "--store", store2, "--json"))["ok"]


def test_tag_naming_another_digest_is_refused_unless_forced(mreg: Any, tmp_path: Path, repo: str) -> None:
    _published(mreg, tmp_path, versions=2)
    ok(mreg("push", "m@1", f"{repo}:prod", "--insecure", "--json"))
    refused = mreg("push", "m@2", f"{repo}:prod", "--insecure", "--json")
    assert refused.exit_code == 5, refused.stdout
    assert refused.json["error"]["type"] == "Conflict" and "--force" in refused.json["error"]["hint"]
    forced = ok(mreg("push", "m@2", f"{repo}:prod", "--insecure", "--force", "--json"))
    assert forced["replaced"] == ok(mreg("push", "m@1", f"{repo}:other", "--insecure", "--json"))["digest"]
    assert forced["uploaded_blobs"] == 4 and forced["present_blobs"] == 1  # m@2's README is m@1's
    default_tag = ok(mreg("push", "m@2", repo, "--insecure", "--json"))
    assert default_tag["tag"] == "2" and default_tag["uploaded_bytes"] == 0


def test_skopeo_reads_the_modelpack_manifest(mreg: Any, tmp_path: Path, repo: str, registry: LocalRegistry) -> None:
    _published(mreg, tmp_path)
    ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo.removeprefix('oci://')}:v1"))
    assert raw["mediaType"] == media.OCI_MANIFEST and raw["artifactType"] == media.MODEL_ARTIFACT
    assert raw["config"]["mediaType"] == media.MODEL_CONFIG
    titles = {layer["annotations"][media.TITLE]: layer["mediaType"] for layer in raw["layers"]}
    assert titles == {"hf/config.json": media.WEIGHT_CONFIG, "hf/model.safetensors": media.WEIGHT,
                      "hf/README.md": media.DOC, ".mreg/manifest.json": media.MREG_MANIFEST}
    manifest = json.loads((tmp_path / "store/models/m/versions/1/manifest.json").read_text())
    shas = {f"hf/{f['path']}": f"sha256:{f['sha256']}" for f in manifest["artifacts"][0]["files"]}
    assert {layer["annotations"][media.TITLE]: layer["digest"] for layer in raw["layers"][:-1]} == shas
    config = json.loads(_skopeo("inspect", "--raw", "--config", "--tls-verify=false",
                                f"docker://{repo.removeprefix('oci://')}:v1"))
    assert config["descriptor"]["name"] == "m" and config["descriptor"]["version"] == "1"
    assert config["modelfs"]["diffIds"] == [layer["digest"] for layer in raw["layers"]]


def test_chunked_push_killed_mid_way_then_repeated(tmp_path: Path, repo: str, mreg: Any) -> None:
    _published(mreg, tmp_path, size=1 << 20)
    killed_push(tmp_path / "store", "m@1", f"{repo}:v1", after=300_000, chunk=128 << 10)
    missing = mreg("pull", f"{repo}:v1", "--insecure", "--json")
    assert missing.exit_code == 3, "no manifest: nothing a reader can mistake for complete"
    from registry import api

    done = api.push(api.open_local_store(tmp_path / "store"), "m@1", f"{repo}:v1", insecure=True,
                        chunk=128 << 10)
    assert not done.reused and done.uploaded_blobs >= 1
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--json"))["files"] == 3


def test_corrupt_layer_on_the_registry_is_refused(mreg: Any, tmp_path: Path, repo: str,
                                                  registry: LocalRegistry) -> None:
    _published(mreg, tmp_path)
    pushed = ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    manifest = json.loads((tmp_path / "store/models/m/versions/1/manifest.json").read_text())
    weights = next(f["sha256"] for f in manifest["artifacts"][0]["files"] if f["path"] == "model.safetensors")
    blob = registry.blob_file(f"sha256:{weights}")
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    try:
        cache2 = tmp_path / "cache2"
        r = mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", cache2, "--json")
        assert r.exit_code == 4 and r.json["error"]["type"] == "IntegrityError", r.stdout
        assert not list(cache2.glob("*/snapshots/*")) and not list(cache2.glob(".mreg/pulls/*/*.json"))
        store2 = tmp_path / "store2"
        s = mreg("sync", f"{repo}@{pushed['digest']}", "--insecure", "--store", store2, "--json")
        assert s.exit_code == 4 and "corrupt" in s.json["error"]["message"]
        assert not (store2 / "models/m/versions/1").exists() and not (store2 / "models/m/production").exists()
    finally:
        data[-1] ^= 0xFF
        blob.write_bytes(bytes(data))


def test_oci_layout_copied_by_skopeo_and_pulled_back(mreg: Any, tmp_path: Path, repo: str) -> None:
    _published(mreg, tmp_path)
    layout = tmp_path / "carry"
    out = ok(mreg("push", "m@1", f"oci-layout:{layout}:v1", "--json"))
    assert (layout / "oci-layout").is_file() and out["uploaded_blobs"] == 5
    assert ok(mreg("push", "m@1", f"oci-layout:{layout}:v1", "--json"))["reused"]
    dest = repo.removeprefix("oci://") + ":v1"
    _skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{dest}")
    raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{dest}"))
    assert raw["artifactType"] == media.MODEL_ARTIFACT
    assert ok(mreg("pull", f"oci-layout:{layout}:v1", "--json"))["files"] == 3
    cache2 = tmp_path / "cache2"
    assert ok(mreg("pull", f"oci://{dest}", "--insecure", "--cache-dir", cache2, "--json"))["files"] == 3
    store2 = tmp_path / "store2"
    assert ok(mreg("sync", f"oci-layout:{layout}", "--store", store2, "--json"))["version"] == 1


def _auth_file(path: Path, host: str, user: str, password: str) -> Path:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def test_credentials_from_the_auth_file(mreg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_binaries()
    pytest.importorskip("bcrypt", reason="bcrypt makes the registry's htpasswd file: pip install bcrypt")
    _published(mreg, tmp_path)
    with LocalRegistry(tmp_path / "authreg", users={"alice": "right-secret"}) as reg:
        target = f"oci://{reg.host}/private/m:v1"
        none = mreg("push", "m@1", target, "--insecure", "--json")
        assert none.exit_code == 13 and "none were found" in none.json["error"]["message"]
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(tmp_path / "wrong.json", reg.host, "alice", "nope-x")))
        wrong = mreg("push", "m@1", target, "--insecure", "--json")
        assert wrong.exit_code == 13 and wrong.json["error"]["type"] == "CredentialsRefused"
        assert "refused the credentials" in wrong.json["error"]["message"]
        assert "nope-x" not in wrong.stdout + wrong.stderr
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(tmp_path / "right.json", reg.host, "alice",
                                                                "right-secret")))
        assert ok(mreg("push", "m@1", target, "--insecure", "--json"))["uploaded_blobs"] == 5
        assert ok(mreg("pull", target, "--insecure", "--json"))["files"] == 3


def test_insecure_is_only_for_loopback(mreg: Any, tmp_path: Path) -> None:
    _published(mreg, tmp_path)
    r = mreg("push", "m@1", "oci://registry.example.com/m:v1", "--insecure", "--json")
    assert r.exit_code == 2 and "loopback" in r.json["error"]["hint"]

