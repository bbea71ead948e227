"""Artifacts other tools wrote, pulled by mreg from the real registry: a plain ORAS artifact pushed with oras-py's
own client, and one with the older `application/vnd.cnai.model.*` media types pushed over the HTTP API."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry
from support.tiny_models import write_random_safetensors

from registry.oci import media


def _model_files(src: Path) -> dict[str, bytes]:
    """A tiny safetensors model (what `convert --to hf` verifies): config, weights, a README."""
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    write_random_safetensors(src / "model.safetensors", 1 << 15, 7)
    (src / "README.md").write_text("# tiny, pushed by another tool\n")
    return {p.name: p.read_bytes() for p in sorted(src.iterdir())}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _pulled_and_converted(mreg: Any, tmp_path: Path, ref: str, files: dict[str, bytes], name: str) -> None:
    cache = tmp_path / "cache-pull"
    pulled = ok(mreg("pull", ref, "--insecure", "--cache-dir", cache, "--json"))
    assert pulled["kind"] == "oci" and pulled["files"] == len(files)
    [snap] = cache.glob("*/snapshots/*")
    assert {p.name: p.read_bytes() for p in snap.iterdir()} == files
    made = ok(mreg("convert", ref, "--insecure", "--cache-dir", cache, "--to", "hf", "--name", name, "--json"))
    assert made["verification"] == {"hf": "passed"}
    assert ok(mreg("verify", f"{name}@1", "--json"))["ok"]


def test_a_plain_oras_artifact_pushed_by_oras_py(mreg: Any, tmp_path: Path, registry: LocalRegistry,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    oras_client = pytest.importorskip("oras.client", reason="oras-py is in the test extra: pip install oras")
    files = _model_files(tmp_path / "src")
    monkeypatch.chdir(tmp_path / "src")  # oras-py titles a layer by its path, which must be under the cwd
    client = oras_client.OrasClient(hostname=registry.host, insecure=True)
    target = f"{registry.host}/t/oras-plain:v1"
    client.push(target=target, files=sorted(files))
    raw = client.get_manifest(target)
    assert raw["config"]["mediaType"] == "application/vnd.unknown.config.v1+json"
    assert {d["mediaType"] for d in raw["layers"]} == {media.ORAS_FILE}  # ORAS's own type for a file
    assert {d["annotations"][media.TITLE]: d["digest"] for d in raw["layers"]} == \
        {n: _sha(b) for n, b in files.items()}
    _pulled_and_converted(mreg, tmp_path, f"oci://{target}", files, "from-oras")


def test_an_oras_packed_directory_is_refused(mreg: Any, tmp_path: Path, registry: LocalRegistry,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    oras_client = pytest.importorskip("oras.client", reason="oras-py is in the test extra: pip install oras")
    _model_files(tmp_path / "work" / "model")
    monkeypatch.chdir(tmp_path / "work")
    client = oras_client.OrasClient(hostname=registry.host, insecure=True)
    target = f"{registry.host}/t/oras-dir:v1"
    client.push(target=target, files=["model"])  # a tar.gz with io.deis.oras.content.unpack
    r = mreg("pull", f"oci://{target}", "--insecure", "--cache-dir", tmp_path / "c", "--json")
    assert r.exit_code == 2 and "not a raw file" in r.json["error"]["message"], r.stdout
    assert not list((tmp_path / "c").glob("*/snapshots/*"))


def _http_push(host: str, repository: str, blobs: list[bytes], manifest: bytes, tag: str) -> None:
    """The distribution API by hand: POST an upload, PUT ?digest= for each blob, then PUT the manifest."""
    base = f"http://{host}/v2/{repository}"
    for blob in blobs:
        start = urllib.request.urlopen(urllib.request.Request(f"{base}/blobs/uploads/", method="POST", data=b""))
        location = start.headers["Location"]
        url = (location if location.startswith("http") else f"http://{host}{location}")
        url += ("&" if "?" in url else "?") + f"digest={_sha(blob)}"
        urllib.request.urlopen(urllib.request.Request(url, method="PUT", data=blob,
                                                      headers={"Content-Type": "application/octet-stream"}))
    urllib.request.urlopen(urllib.request.Request(f"{base}/manifests/{tag}", method="PUT", data=manifest,
                                                  headers={"Content-Type": media.OCI_MANIFEST}))


def test_an_older_cnai_artifact(mreg: Any, tmp_path: Path, registry: LocalRegistry) -> None:
    files = _model_files(tmp_path / "src")
    kinds = {"config.json": "weight.config", "model.safetensors": "weight", "README.md": "doc"}
    config = json.dumps({"descriptor": {"name": "cnai-tiny"}, "config": {"format": "safetensors"},
                         "modelfs": {"type": "layers", "diffIds": [_sha(b) for b in files.values()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": media.OCI_MANIFEST,
        "artifactType": "application/vnd.cnai.model.manifest.v1+json",
        "config": {"mediaType": "application/vnd.cnai.model.config.v1+json", "digest": _sha(config),
                   "size": len(config)},
        "layers": [{"mediaType": f"application/vnd.cnai.model.{kinds[n]}.v1.raw", "digest": _sha(b), "size": len(b),
                    "annotations": {media.TITLE: n}} for n, b in files.items()],
    }).encode()
    _http_push(registry.host, "t/cnai", [config, *files.values()], manifest, "v1")
    _pulled_and_converted(mreg, tmp_path, f"oci://{registry.host}/t/cnai@{_sha(manifest)}", files, "from-cnai")
