"""`--as-image` (a regular OCI image of a version) and `oci-archive:` (a layout as one tar file), against a real
distribution registry on loopback and Debian's skopeo."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry, killed_push
from support.tiny_models import write_random_safetensors

from registry.oci import media
from registry.oci.image import TarLayer, tar_header

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(registry: LocalRegistry, request: pytest.FixtureRequest) -> str:
    """A fresh repository, as HOST/REPO (skopeo's docker:// form without the scheme)."""
    return f"{registry.host}/i/{request.node.name.lower().replace('_', '-')}"


def _published(mreg: Any, tmp_path: Path, seed: int = 0, size: int = 1 << 16) -> None:
    root = tmp_path / f"src{seed}"
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (root / "README.md").write_text("# tiny\n")  # the same in every version: a blob shared between them
    write_random_safetensors(root / "model.safetensors", size, seed)
    ok(mreg("convert", root, "--to", "hf", "--name", "m", "--json"))


def _skopeo(*args: str) -> str:
    return subprocess.run(["skopeo", *args], check=True, capture_output=True, text=True, timeout=60).stdout


def _version_files(store_root: Path, n: int = 1) -> dict[str, bytes]:
    """The files an image of m@n must hold, at their paths in the image."""
    vdir = store_root / f"models/m/versions/{n}"
    manifest = json.loads((vdir / "manifest.json").read_text())
    files = {f"models/m/{a['path']}/{f['path']}": (vdir / a["path"] / f["path"]).read_bytes()
             for a in manifest["artifacts"] for f in a["files"]}
    return {**files, "models/m/manifest.json": (vdir / "manifest.json").read_bytes()}


def _unpack_layout(layout: Path, tag: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest a layout tags, and the tree its layers make, applied in order (as a runtime does)."""
    index = json.loads((layout / "index.json").read_text())
    entry = next(m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    blob = lambda d: layout / "blobs" / d.replace(":", "/")  # noqa: E731
    manifest = json.loads(blob(entry["digest"]).read_bytes())
    tree: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        ours = media.MREG_PATH in layer.get("annotations", {})
        assert not ours or layer["mediaType"] == media.TAR_LAYER
        with tarfile.open(blob(layer["digest"]), "r:*") as tf:
            for m in tf:
                fixed = m.mtime == 0 and m.uid == 0 and m.gid == 0 and not m.uname and "mtime" not in m.pax_headers
                assert fixed or not ours
                if m.isfile():
                    assert m.mode == 0o644 or not ours
                    f = tf.extractfile(m)
                    assert f is not None
                    tree[m.name] = f.read()
                else:
                    assert m.isdir() and (m.mode == 0o755 or not ours)
    return manifest, tree


def _write_blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs/sha256" / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _base_layout(layout: Path) -> tuple[bytes, str]:
    """A stand-in for busybox, as Docker Hub serves it: an index (arm64 and amd64) over Docker-typed manifests with
    a gzip layer holding bin/sh. Returns the layer tar and the amd64 manifest's digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("bin/sh")
        info.size, info.mode = 13, 0o755
        tf.addfile(info, io.BytesIO(b"#!busybox sh\n"))
    layer_tar = buf.getvalue()
    layer = _write_blob(layout, gzip.compress(layer_tar, mtime=0))
    manifests = []
    for arch in ("arm64", "amd64"):
        config = _write_blob(layout, json.dumps({
            "architecture": arch, "os": "linux", "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"],
                                                            "Labels": {"base": "busybox"}},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()]},
            "history": [{"created_by": "ADD bin/sh"}]}).encode())
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": media.DOCKER_MANIFEST,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", **layer}]}).encode()
        manifests.append({"mediaType": media.DOCKER_MANIFEST, **_write_blob(layout, manifest),
                          "platform": {"os": "linux", "architecture": arch}})
    index = json.dumps({"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": manifests}).encode()
    entry = {"mediaType": media.OCI_INDEX, **_write_blob(layout, index),
             "annotations": {"org.opencontainers.image.ref.name": "base"}}
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return layer_tar, manifests[1]["digest"]


def test_tar_layer_bytes_are_fixed_and_seekable(tmp_path: Path) -> None:
    """The layer made while sent is a valid tar whose every range is the same bytes, whatever the offset."""
    data = os.urandom(70_001)
    (tmp_path / "f").write_bytes(data)
    long_path = "models/m/hf/" + "d" * 90 + "/weights.safetensors"  # over 100 bytes: a PAX path record
    layer = TarLayer(long_path, tar_header(long_path, len(data)), len(data), file=tmp_path / "f")
    whole = b"".join(layer.chunks())
    assert len(whole) == layer.size and len(whole) % 512 == 0
    for start, length in ((0, 1), (511, 2), (len(layer.header) - 3, 10), (len(whole) - 1100, None), (7, 65_536)):
        assert b"".join(layer.chunks(start, length)) == whole[start:None if length is None else start + length]
    with tarfile.open(fileobj=io.BytesIO(whole)) as tf:
        names = tf.getnames()
        got = tf.extractfile(long_path)
        assert got is not None and got.read() == data
        assert all("mtime" not in m.pax_headers for m in tf.getmembers())
    assert names[:3] == ["models", "models/m", "models/m/hf"]
    assert tar_header(long_path, len(data)) == layer.header  # nothing in a header depends on when it was made


def test_as_image_unpacks_into_the_version_tree(mreg: Any, tmp_path: Path, repo: str, store_root: Path) -> None:
    _published(mreg, tmp_path)
    pushed = ok(mreg("push", "m@1", f"oci://{repo}:v1", "--as-image", "--insecure", "--json"))
    assert pushed["as_image"] and pushed["uploaded_blobs"] == 5  # 3 file layers, the manifest layer, the config
    raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:v1"))
    assert raw["mediaType"] == media.OCI_MANIFEST and "artifactType" not in raw
    assert raw["config"]["mediaType"] == media.IMAGE_CONFIG
    assert {layer["mediaType"] for layer in raw["layers"]} == {media.TAR_LAYER}
    assert raw["annotations"][media.MREG_NAME] == "m" and raw["annotations"][media.MREG_VERSION] == "1"
    config = json.loads(_skopeo("inspect", "--raw", "--config", "--tls-verify=false", f"docker://{repo}:v1"))
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in raw["layers"]]
    assert config["config"]["Labels"][media.MREG_VERSION] == "1" and "Cmd" not in config["config"]

    layout = tmp_path / "copied"
    _skopeo("copy", "--preserve-digests", "--src-tls-verify=false", f"docker://{repo}:v1", f"oci:{layout}:v1")
    manifest, tree = _unpack_layout(layout, "v1")
    assert tree == _version_files(store_root)
    assert manifest["layers"][-1]["annotations"][media.MREG_PATH] == "models/m/manifest.json"

    again = ok(mreg("push", "m@1", f"oci://{repo}:v1", "--as-image", "--insecure", "--json"))
    assert again["reused"] and again["uploaded_bytes"] == 0
    shutil.rmtree(store_root / "caches" / "oci-image")  # the digests are remade, byte for byte the same
    other_tag = ok(mreg("push", "m@1", f"oci://{repo}", "--as-image", "--insecure", "--json"))
    assert other_tag["tag"] == "1-image" and other_tag["digest"] == pushed["digest"]
    assert other_tag["uploaded_bytes"] == 0 and other_tag["present_blobs"] == 5

    _published(mreg, tmp_path, seed=1)
    second = ok(mreg("push", "m@2", f"oci://{repo}", "--as-image", "--insecure", "--json"))
    assert second["tag"] == "2-image" and second["present_blobs"] == 1  # README.md: same bytes, same path

    assert mreg("push", "m@1", "s3://bucket/prefix", "--as-image", "--json").exit_code == 2


def test_an_image_is_pulled_and_synced_as_its_version(mreg: Any, tmp_path: Path, repo: str, store_root: Path,
                                                      registry: LocalRegistry) -> None:
    """Only the image published: pull and sync read its layers back (each exactly the tar mreg makes), the
    version reproduced byte for byte; a damaged layer on the registry's disk is refused, nothing written."""
    _published(mreg, tmp_path)
    pushed = ok(mreg("push", "m@1", f"oci://{repo}:v1", "--as-image", "--insecure", "--json"))
    cache2 = tmp_path / "cache2"
    pulled = ok(mreg("pull", f"oci://{repo}@{pushed['digest']}", "--insecure", "--cache-dir", cache2, "--json"))
    assert pulled["files"] == 3 and pulled["commit"] == pushed["digest"].split(":")[1]
    store2 = tmp_path / "store2"
    synced = ok(mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", store2, "--json"))
    assert synced["version"] == 1 and synced["digest"] == pushed["digest"]
    assert (store2 / "models/m/versions/1/manifest.json").read_bytes() == \
        (store_root / "models/m/versions/1/manifest.json").read_bytes()
    assert ok(mreg("verify", "m@1", "--store", store2, "--json"))["ok"]

    raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:v1"))
    weights = next(d for d in raw["layers"] if d["annotations"][media.MREG_PATH].endswith("model.safetensors"))
    blob = registry.blob_file(weights["digest"])
    good = blob.read_bytes()
    for at in (100, 3000):  # a header's name, then the file past the headers
        data = bytearray(good)
        data[at] ^= 0xFF
        blob.write_bytes(bytes(data))
        try:
            cache3, store3 = tmp_path / f"cache-{at}", tmp_path / f"store-{at}"
            r = mreg("pull", f"oci://{repo}:v1", "--insecure", "--cache-dir", cache3, "--json")
            assert r.exit_code == 4 and r.json["error"]["type"] == "IntegrityError", r.stdout
            assert not list(cache3.glob("*/snapshots/*")) and not list(cache3.glob(".mreg/pulls/*/*.json"))
            s = mreg("sync", f"oci://{repo}:v1", "--insecure", "--store", store3, "--json")
            assert s.exit_code == 4 and not (store3 / "models/m/versions/1").exists()
        finally:
            blob.write_bytes(good)


def test_as_image_over_a_base_image_for_a_kserve_modelcar(mreg: Any, tmp_path: Path, repo: str,
                                                          store_root: Path) -> None:
    """--base puts a shell image's layers below the model's (KServe runs `sh` in a modelcar): the amd64 image of
    an index, Docker media types renamed to OCI's, the base's config kept with mreg's labels added."""
    _published(mreg, tmp_path)
    layer_tar, amd64 = _base_layout(tmp_path / "busybox")
    base = f"oci-layout:{tmp_path / 'busybox'}:base"
    pushed = ok(mreg("push", "m@1", f"oci://{repo}:car", "--as-image", "--base", base, "--insecure", "--json"))
    assert pushed["uploaded_blobs"] == 6 and pushed["base"] == base  # the base layer, 4 of ours, the config
    raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:car"))
    assert raw["layers"][0]["mediaType"] == media.TAR_LAYER + "+gzip" and len(raw["layers"]) == 5
    assert raw["annotations"][media.BASE_DIGEST] == amd64 and media.BASE_NAME not in raw["annotations"]  # no ref
    config = json.loads(_skopeo("inspect", "--raw", "--config", "--tls-verify=false", f"docker://{repo}:car"))
    assert config["config"]["Cmd"] == ["sh"] and config["config"]["Labels"]["base"] == "busybox"
    assert config["config"]["Labels"][media.MREG_NAME] == "m" and len(config["history"]) == 5
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_tar).hexdigest(),
                                            *(layer["digest"] for layer in raw["layers"][1:])]
    layout = tmp_path / "copied"
    _skopeo("copy", "--preserve-digests", "--src-tls-verify=false", f"docker://{repo}:car", f"oci:{layout}:car")
    assert _unpack_layout(layout, "car")[1] == {"bin/sh": b"#!busybox sh\n", **_version_files(store_root)}
    again = ok(mreg("push", "m@1", f"oci://{repo}:car2", "--as-image", "--base", base, "--insecure", "--json"))
    assert again["digest"] == pushed["digest"] and again["uploaded_bytes"] == 0
    no_image = mreg("push", "m@1", f"oci://{repo}:x", "--base", base, "--insecure", "--json")
    assert no_image.exit_code == 2 and "--as-image" in no_image.json["error"]["hint"]
    mirror = f"{repo}-mirror/busybox:1"  # the base in a registry, read through its index; its layer streamed over
    _skopeo("copy", "--all", "--preserve-digests", "--dest-tls-verify=false", f"oci:{tmp_path / 'busybox'}:base",
            f"docker://{mirror}")
    remote = ok(mreg("push", "m@1", f"oci://{repo}-2:car", "--as-image", "--base", f"oci://{mirror}", "--insecure",
                     "--json"))
    remote_raw = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}-2:car"))
    assert remote_raw["layers"] == raw["layers"] and remote["uploaded_blobs"] == 6
    assert remote_raw["annotations"][media.BASE_DIGEST] == amd64
    assert remote_raw["annotations"][media.BASE_NAME] == mirror  # a plain image reference, no oci:// scheme
    assert ok(mreg("pull", f"oci://{repo}:car", "--insecure", "--cache-dir", tmp_path / "c2", "--json"))["files"] == 3
    foreign = mreg("pull", f"oci://{repo}-mirror/busybox@{amd64}", "--insecure", "--json")
    assert foreign.exit_code == 2 and "container image mreg did not make" in foreign.json["error"]["message"]
    ok(mreg("push", "m@1", f"oci://{repo}:artifact", "--insecure", "--json"))
    not_a_base = mreg("push", "m@1", f"oci://{repo}:x", "--as-image", "--base", f"oci://{repo}:artifact",
                      "--insecure", "--json")
    assert not_a_base.exit_code == 2 and "not a container image" in not_a_base.json["error"]["message"]
    assert mreg("push", "m@1", f"oci://{repo}:x", "--as-image", "--base", f"oci://{repo}:none", "--insecure",
                "--json").exit_code == 3


def test_as_image_chunked_and_into_an_archive(tmp_path: Path, repo: str, mreg: Any, store_root: Path) -> None:
    """Chunked uploads cut a tar layer at arbitrary offsets (header, file, padding): the registry still gets the
    digest it was promised; the same image into an archive is byte-identical."""
    from registry import api

    _published(mreg, tmp_path, size=300_000)
    store = api.open_local_store(store_root)
    out = api.push(store, "m@1", f"oci://{repo}:c", insecure=True, chunk=100_000, as_image=True)
    layout = tmp_path / "copied"
    _skopeo("copy", "--preserve-digests", "--src-tls-verify=false", f"docker://{repo}:c", f"oci:{layout}:c")
    assert _unpack_layout(layout, "c")[1] == _version_files(store_root)
    archived = ok(mreg("push", "m@1", f"oci-archive:{tmp_path / 'img.tar'}:c", "--as-image", "--json"))
    assert archived["digest"] == out.digest
    raw = json.loads(_skopeo("inspect", "--raw", f"oci-archive:{tmp_path / 'img.tar'}:c"))
    assert raw["config"]["mediaType"] == media.IMAGE_CONFIG


def test_archive_through_skopeo_into_the_registry_and_back(mreg: Any, tmp_path: Path, repo: str,
                                                          store_root: Path) -> None:
    _published(mreg, tmp_path)
    _published(mreg, tmp_path, seed=1)
    carry = tmp_path / "usb" / "carry.tar"
    first = ok(mreg("push", "m@1", f"oci-archive:{carry}:v1", "--json"))
    assert first["uploaded_blobs"] == 5 and carry.is_file()
    with tarfile.open(carry) as tf:
        names = tf.getnames()
    assert names[0] == "oci-layout" and names[-1] == "index.json"
    assert ok(mreg("push", "m@1", f"oci-archive:{carry}:v1", "--json"))["reused"]
    second = ok(mreg("push", "m@2", f"oci-archive:{carry}:v2", "--json"))  # the archive is rewritten, v1 kept
    assert second["present_blobs"] == 1 and second["uploaded_blobs"] == 4  # m@2 shares README.md with m@1
    assert list(carry.parent.iterdir()) == [carry], "no temporary file is left behind"

    _skopeo("copy", "--dest-tls-verify=false", f"oci-archive:{carry}:v1", f"docker://{repo}:v1")
    cache2 = tmp_path / "cache2"
    pulled = ok(mreg("pull", f"oci://{repo}:v1", "--insecure", "--cache-dir", cache2, "--json"))
    assert pulled["files"] == 3 and pulled["commit"] == first["digest"].split(":")[1]
    local = ok(mreg("pull", f"oci-archive:{carry}:v2", "--json"))
    assert local["files"] == 3 and local["commit"] == second["digest"].split(":")[1]
    made = ok(mreg("convert", f"oci-archive:{carry}:v1", "--to", "hf", "--name", "m3", "--json"))
    assert made["verification"] == {"hf": "passed"}
    store2 = tmp_path / "store2"
    synced = ok(mreg("sync", f"oci-archive:{carry}:v2", "--store", store2, "--json"))
    assert synced["version"] == 2 and ok(mreg("verify", "m@2", "--store", store2, "--json"))["ok"]
    assert (store2 / "models/m/versions/2/manifest.json").read_bytes() == \
        (store_root / "models/m/versions/2/manifest.json").read_bytes()


def test_skopeo_written_archive_is_pulled(mreg: Any, tmp_path: Path, repo: str) -> None:
    _published(mreg, tmp_path)
    pushed = ok(mreg("push", "m@1", f"oci://{repo}:v1", "--insecure", "--json"))
    carry = tmp_path / "from-skopeo.tar"
    _skopeo("copy", "--src-tls-verify=false", f"docker://{repo}:v1", f"oci-archive:{carry}:v1")
    pulled = ok(mreg("pull", f"oci-archive:{carry}:v1", "--json"))
    assert pulled["files"] == 3 and pulled["commit"] == pushed["digest"].split(":")[1]
    assert ok(mreg("pull", f"oci-archive:{carry}", "--json"))["from_cache"]  # one manifest: no tag needed


def _rewrite(src: Path, dest: Path, change: Any) -> Path:
    """A copy of an archive with its members passed through `change(info, data) -> [(info, data)]`."""
    with tarfile.open(src) as tf, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
        for m in tf.getmembers():
            f = tf.extractfile(m)
            for info, data in change(m, f.read() if f else b""):
                out.addfile(info, io.BytesIO(data) if data is not None else None)
    return dest


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def test_hostile_archives_are_refused(mreg: Any, tmp_path: Path, store_root: Path) -> None:
    """Each is one line, exit 4, and nothing reaches the cache."""
    _published(mreg, tmp_path)
    good = tmp_path / "good.tar"
    ok(mreg("push", "m@1", f"oci-archive:{good}:v1", "--json"))
    weights = next(f["sha256"] for f in json.loads((store_root / "models/m/versions/1/manifest.json").read_text())
                   ["artifacts"][0]["files"] if f["path"] == "model.safetensors")
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])

    def dotdot(m: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        if m.name.endswith(weights):
            m.name = "blobs/../../escape"
        return [(m, data)]

    def symlink(m: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        return [(_link(m.name, "/etc/passwd"), None)] if m.name.endswith(weights) else [(m, data)]

    def absent(m: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        return [] if m.name.endswith(weights) else [(m, data)]

    cases = {
        "truncated": (truncated, "truncated"),
        "dotdot": (_rewrite(good, tmp_path / "dotdot.tar", dotdot), "not a plain relative path"),
        "symlink": (_rewrite(good, tmp_path / "symlink.tar", symlink), "is a link"),
        "absent": (_rewrite(good, tmp_path / "absent.tar", absent), "absent"),
        "not-a-tar": (tmp_path / "notes.tar", "not a readable tar archive"),
    }
    (tmp_path / "notes.tar").write_bytes(b"hello\n" * 300)
    cache2 = tmp_path / "cache2"
    for what, (path, words) in cases.items():
        r = mreg("pull", f"oci-archive:{path}:v1", "--cache-dir", cache2, "--json")
        assert r.exit_code == 4, (what, r.stdout)
        assert r.json["error"]["type"] == "IntegrityError" and words in r.json["error"]["message"], what
        assert "\n" not in r.json["error"]["message"]
    assert not list(cache2.glob("*/snapshots/*")) and not list(cache2.glob(".mreg/pulls/*/*.json"))
    assert not (tmp_path / "escape").exists()
    before = (tmp_path / "notes.tar").read_bytes()
    r = mreg("push", "m@1", f"oci-archive:{tmp_path / 'notes.tar'}:v1", "--json")
    assert r.exit_code == 4 and (tmp_path / "notes.tar").read_bytes() == before, "a push never clobbers a non-archive"
    missing = mreg("pull", f"oci-archive:{tmp_path / 'nope.tar'}", "--json")
    assert missing.exit_code == 3


def test_killed_archive_push_leaves_the_old_archive(tmp_path: Path, mreg: Any, store_root: Path) -> None:
    _published(mreg, tmp_path, size=1 << 20)
    _published(mreg, tmp_path, seed=1, size=1 << 20)
    carry = tmp_path / "usb" / "carry.tar"
    ok(mreg("push", "m@1", f"oci-archive:{carry}:v1", "--json"))
    before = carry.read_bytes()
    killed_push(store_root, "m@2", f"oci-archive:{carry}:v2", after=300_000, insecure=False)
    assert carry.read_bytes() == before, "the archive under its name is the old one, whole"
    assert len(list(carry.parent.iterdir())) == 2  # and the killed writer's temporary file
    ok(mreg("push", "m@2", f"oci-archive:{carry}:v2", "--json"))
    assert list(carry.parent.iterdir()) == [carry], "the next push sweeps the dead writer's temporary file"
    assert ok(mreg("pull", f"oci-archive:{carry}:v1", "--json"))["files"] == 3
    assert ok(mreg("pull", f"oci-archive:{carry}:v2", "--json"))["files"] == 3


@pytest.mark.parametrize("fmt", ["v2s2", "oci"])
def test_an_image_copied_by_skopeo_is_still_the_version(mreg: Any, tmp_path: Path, repo: str, store_root: Path,
                                                        fmt: str) -> None:
    """A mirror rewrites the manifest (as `podman push` from its storage does): through a docker-archive and back
    into the registry, every layer keeps its digest (reused, not recompressed) but loses its annotations, and the
    manifest may turn Docker's. Pull and sync still read the version, from the config's labels and the layers'
    order, each layer still checked against the tar mreg makes for its path."""
    repo = f"{repo.split('[')[0]}-{fmt}"
    _published(mreg, tmp_path)
    ok(mreg("push", "m@1", f"oci://{repo}:v1", "--as-image", "--insecure", "--json"))
    archive = tmp_path / "saved.tar"
    _skopeo("copy", "--src-tls-verify=false", f"docker://{repo}:v1", f"docker-archive:{archive}:m:v1")
    _skopeo("copy", "--dest-tls-verify=false", "--format", fmt, f"docker-archive:{archive}", f"docker://{repo}:copy")
    original = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:v1"))
    copied = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:copy"))
    assert [d["digest"] for d in copied["layers"]] == [d["digest"] for d in original["layers"]]
    assert not any(d.get("annotations") for d in copied["layers"])  # what the copy lost
    if fmt == "v2s2":  # containers/image labels a Docker manifest's layers gzip whatever they hold: a label only
        assert {d["mediaType"] for d in copied["layers"]} == {"application/vnd.docker.image.rootfs.diff.tar.gzip"}
    pulled = ok(mreg("pull", f"oci://{repo}:copy", "--insecure", "--cache-dir", tmp_path / "c2", "--json"))
    assert pulled["files"] == 3
    store2 = tmp_path / "store2"
    synced = ok(mreg("sync", f"oci://{repo}:copy", "--insecure", "--store", store2, "--json"))
    assert synced["version"] == 1
    assert (store2 / "models/m/versions/1/manifest.json").read_bytes() == \
        (store_root / "models/m/versions/1/manifest.json").read_bytes()
    assert ok(mreg("verify", "m@1", "--store", store2, "--json"))["ok"]
