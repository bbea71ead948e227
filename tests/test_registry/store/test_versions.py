"""Versions: content-addressed blobs, hard-linked trees, manifest last, keyed reuse, references, races."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from registry import layout
from registry.cache import pull_local
from registry.convert.execute import convert
from registry.errors import Conflict, IntegrityError
from registry.refs import parse_ref
from registry.store.local import LocalStore


def test_convert_publishes_a_complete_linked_version(mreg: Any, model_dir: Path, store_root: Path) -> None:
    r = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr
    doc = r.json
    assert doc["version"] == 1 and doc["reused"] is False and doc["verification"] == {"hf": "passed"}
    vdir = store_root / "models" / "m" / "versions" / "1"
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["version"] == 1
    for f in manifest["artifacts"][0]["files"]:
        p = vdir / "hf" / f["path"]
        blob = layout.blob_path(store_root, f["sha256"])
        assert p.stat().st_ino == blob.stat().st_ino, "artifact files are hard links to their blobs"
        assert not os.access(blob, os.W_OK) or os.getuid() == 0
        assert blob.stat().st_mode & 0o222 == 0, "blobs are read-only"
    assert {f["path"] for f in manifest["source"]["files"]} == {"config.json", "model.safetensors"}
    assert not list((store_root / "tmp").iterdir()), "no staging left behind"


def test_same_conversion_is_reused(mreg: Any, model_dir: Path, store_root: Path) -> None:
    first = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    again = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    assert again["reused"] is True and again["version"] == first["version"] == 1
    assert again["manifest_sha256"] == first["manifest_sha256"]
    assert [p.name for p in (store_root / "models" / "m" / "versions").iterdir()] == ["1"]


def test_a_new_converter_version_converts_again(mreg: Any, model_dir: Path, store_root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The converter's version is in the key: a conversion made before a check was added (NaN/Inf) is not found
    as "passed" by an mreg that has the check; it is made again, as a new version."""
    from converters.hf.converter import HFConverter

    first = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    monkeypatch.setattr(HFConverter, "version", str(int(HFConverter.version) + 1))
    again = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    assert again["reused"] is False and again["version"] == first["version"] + 1
    assert again["manifest_sha256"] != first["manifest_sha256"]
    manifest = json.loads((store_root / "models/m/versions/2/manifest.json").read_text())
    assert manifest["artifacts"][0]["converter"]["version"] == HFConverter.version
    same = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    assert same["reused"] is True and same["version"] == again["version"]


def test_identical_files_are_stored_once(mreg: Any, model_dir: Path, store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    (model_dir / "config.json").write_text('{"changed": true}')
    r = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json")
    assert r.json["version"] == 2
    v1 = store_root / "models/m/versions/1/hf/model.safetensors"
    v2 = store_root / "models/m/versions/2/hf/model.safetensors"
    assert v1.stat().st_ino == v2.stat().st_ino
    blobs = list((store_root / "blobs" / "sha256").rglob("*"))
    assert len([b for b in blobs if b.is_file()]) == 3  # one weights blob, two configs


def test_copy_mode_is_independent_of_the_cache(mreg: Any, model_dir: Path, store_root: Path, cache_root: Path) -> None:
    r = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--copy", "--json")
    assert r.exit_code == 0
    weights = store_root / "models/m/versions/1/hf/model.safetensors"
    cached = [p for p in cache_root.rglob("*") if p.is_file() and p.stat().st_size == weights.stat().st_size]
    assert cached and all(p.stat().st_ino != weights.stat().st_ino for p in cached)


def test_cache_edited_after_pull_is_caught(mreg: Any, model_dir: Path, cache_root: Path, store_root: Path) -> None:
    snap = pull_local(cache_root, model_dir)
    blob = snap.file("model.safetensors")
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(-8, os.SEEK_END)  # in the weights: the header still parses, only the digest can tell
        f.write(b"tampered")
    os.utime(blob, (snap.record.pulled.at.timestamp() + 100,) * 2)
    with pytest.raises(IntegrityError, match="changed since it was pulled"):
        convert(LocalStore(store_root), snap, "m", [("hf", {})])
    assert LocalStore(store_root).versions("m") == []


def test_references(mreg: Any, model_dir: Path) -> None:
    one = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    (model_dir / "config.json").write_text("{}")
    two = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    mreg("promote", "m@1")
    assert mreg("show", "m@1", "--json").json["version"] == 1
    assert mreg("show", "m@production", "--json").json["version"] == 1
    assert mreg("show", "m", "--json").json["version"] == 2  # latest
    assert mreg("show", f"m@{two['manifest_sha256'][:10]}", "--json").json["version"] == 2
    assert mreg("show", f"m@{one['manifest_sha256'][:8]}", "--json").json["version"] == 1
    r = mreg("show", "m@7")
    assert r.exit_code == 3 and "m@7 does not exist" in r.stderr and "mreg list m" in r.stderr
    r = mreg("show", "nope@1")
    assert r.exit_code == 3 and "not in the store" in r.stderr
    r = mreg("show", "../etc@1")
    assert r.exit_code == 2


def test_lost_number_race_takes_the_next(model_dir: Path, cache_root: Path, store_root: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(store_root)
    snap = pull_local(cache_root, model_dir)
    convert(store, snap, "m", [("hf", {})])
    # Another writer published 2 and 3 after we read the directory: our rename onto 2 must fail and move on.
    monkeypatch.setattr(LocalStore, "_taken_numbers", lambda self, name: [1])
    v1 = json.loads((layout.version_dir(store_root, "m", 1) / "manifest.json").read_text())
    for n in (2, 3):
        d = layout.version_dir(store_root, "m", n)
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({**v1, "version": n}))
    (model_dir / "config.json").write_text('{"new": 1}')
    out = convert(store, pull_local(cache_root, model_dir), "m", [("hf", {})])
    assert out.version.number == 4
    assert json.loads((layout.version_dir(store_root, "m", 4) / "manifest.json").read_text())["version"] == 4


def test_failed_rename_leaves_nothing_visible(model_dir: Path, cache_root: Path, store_root: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(store_root)
    snap = pull_local(cache_root, model_dir)
    real_rename = os.rename

    def failing_rename(src: Any, dst: Any) -> None:
        if "versions" in str(dst):
            raise OSError(errno.EIO, "simulated I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        convert(store, snap, "m", [("hf", {})])
    monkeypatch.setattr(os, "rename", real_rename)
    assert store.versions("m") == []
    assert not any(store.tmp.iterdir()), "the staging tree was discarded"
    assert convert(store, snap, "m", [("hf", {})]).version.number == 1


def test_full_disk_during_copy_is_a_clear_error(model_dir: Path, cache_root: Path, store_root: Path,
                                               monkeypatch: pytest.MonkeyPatch, mreg: Any) -> None:
    import builtins

    store = LocalStore(store_root)
    snap = pull_local(cache_root, model_dir)
    real_open = builtins.open

    class FullFile:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __getattr__(self, k: str) -> Any:
            return getattr(self.f, k)

        def __enter__(self) -> FullFile:
            return self

        def __exit__(self, *a: Any) -> None:
            self.f.close()

        def write(self, b: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    def fake_open(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        f = real_open(file, mode, *a, **k)
        return FullFile(f) if mode == "xb" and "stage-" in str(file) else f

    monkeypatch.setattr(builtins, "open", fake_open)
    from registry.errors import InsufficientSpace

    with pytest.raises(InsufficientSpace, match="no space left"):
        convert(store, snap, "m", [("hf", {})], copy=True)
    monkeypatch.setattr(builtins, "open", real_open)
    assert store.versions("m") == [] and not any(store.tmp.iterdir())


def test_parse_ref() -> None:
    assert parse_ref("m@3").number == 3
    assert parse_ref("m").ref == "latest"
    assert parse_ref("m@production").number is None
    with pytest.raises(Conflict.__mro__[1]):
        parse_ref("m@0")


def test_convert_from_a_version(mreg: Any, model_dir: Path) -> None:
    first = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json
    again = mreg("convert", "m@1", "--to", "hf", "--json")
    assert again.exit_code == 0, again.stderr
    assert again.json["reused"] is True and again.json["version"] == first["version"], \
        "the same conversion of the same source is the same version"
    r = mreg("convert", model_dir, "--to", "hf")
    assert r.exit_code == 2 and "--name is required" in r.stderr


@pytest.mark.slow
def test_two_targets_of_one_format_and_carrying_them(mreg: Any, tmp_path: Path, store_root: Path) -> None:
    pytest.importorskip("llama_cpp")
    from support.tiny_models import build_tiny_llama

    src = build_tiny_llama(tmp_path / "llama")
    r = mreg("convert", src, "--to", "gguf:Q8_0", "--to", "gguf:Q4_K_M", "--name", "tl", "--json")
    assert r.exit_code == 0, r.stderr
    one = store_root / "models/tl/versions/1"
    assert sorted(p.name for p in (one / "gguf").iterdir()) == ["tl-Q4_K_M.gguf", "tl-Q8_0.gguf"], \
        "files are named after the model, so an engine's path stays the same across versions"
    arts = mreg("show", "tl@1", "--json").json["manifest"]["artifacts"]
    assert [[f["path"] for f in a["files"]] for a in arts] == [["tl-Q8_0.gguf"], ["tl-Q4_K_M.gguf"]]
    two = mreg("convert", "tl@1", "--to", "hf", "--json").json
    assert two["version"] == 2 and sorted(two["formats"]) == ["gguf", "gguf", "hf"]
    v2 = store_root / "models/tl/versions/2"
    for name in ("tl-Q8_0.gguf", "tl-Q4_K_M.gguf"):
        assert (v2 / "gguf" / name).stat().st_ino == (one / "gguf" / name).stat().st_ino, "carried, not copied"
    assert mreg("show", "tl@2", "--json").json["manifest"]["parent"] == 1
    assert mreg("verify", "tl@2").exit_code == 0


@pytest.mark.slow
def test_a_cached_file_edited_in_place_with_its_mtime_kept_is_not_published(
        mreg: Any, model_dir: Path, cache_root: Path, store_root: Path) -> None:
    """The link from the cache is trusted while neither mtime nor ctime moved since the pull; else it is hashed."""
    for p in model_dir.iterdir():  # an old directory: the convert finds its import unchanged and reads the cache
        os.utime(p, (time.time() - 3600,) * 2)
    time.sleep(2.1)  # ctime too (the import's racy window)
    assert mreg("pull", model_dir, "--copy").exit_code == 0
    size = (model_dir / "model.safetensors").stat().st_size
    (blob,) = [p for p in cache_root.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size == size]
    st = blob.stat()
    time.sleep(1.2)  # past the second of slack that coarse filesystem clocks get
    os.chmod(blob, 0o644)
    with blob.open("r+b") as f:
        f.seek(-8, os.SEEK_END)  # in the weights: the header still parses, only the digest can tell
        f.write(b"tampered")
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime says nothing changed
    r = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 4 and "changed since it was pulled" in r.json["error"]["message"], r.stderr
    assert not (store_root / "models" / "m" / "versions" / "1").exists()


def test_a_file_linked_into_one_version_is_linked_into_the_next_after_a_hash(
        mreg: Any, model_dir: Path, cache_root: Path, store_root: Path) -> None:
    """Linking moves the cached file's ctime; the next conversion hashes it once and still links (no copy)."""
    assert mreg("convert", model_dir, "--to", "hf", "--name", "a").exit_code == 0
    assert mreg("convert", model_dir, "--to", "hf", "--name", "b").exit_code == 0
    a = store_root / "models" / "a" / "versions" / "1" / "hf" / "model.safetensors"
    b = store_root / "models" / "b" / "versions" / "1" / "hf" / "model.safetensors"
    assert a.stat().st_ino == b.stat().st_ino, "one blob, linked twice"


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_leftovers_of_killed_writers_are_swept_by_the_next_one(mreg: Any, model_dir: Path, cache_root: Path,
                                                                store_root: Path) -> None:
    """A killed flip leaves `.production.alias-*`, a killed import `.import.tmp-*`: the next writer removes them,
    and never a temp whose writer is alive."""
    from registry import atomic, layout

    assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    model = layout.model_dir(store_root, "m")
    dead, alive = _dead_pid(), os.getpid()
    host = atomic.temp_name(model / "x").name.split("-")[1]
    stale = model / f".production.alias-{host}-{dead}-0123456789ab"
    live = model / f".production.alias-{host}-{alive}-0123456789ab"
    for p in (stale, live):
        p.symlink_to("versions/1")
    assert mreg("promote", "m@1").exit_code == 0
    assert not stale.is_symlink() and live.is_symlink()
    assert os.readlink(model / "production") == "versions/1"

    (blobs,) = [p for p in cache_root.glob("models--*/blobs")]
    left = blobs / f".import.tmp-{host}-{dead}-0123456789ab"
    left.write_bytes(b"half a file")
    (model_dir / "config.json").write_text('{"changed": true}')  # a new import of the directory
    assert mreg("pull", model_dir).exit_code == 0
    assert not left.exists()


def test_a_carried_blob_that_is_missing_is_one_line_not_a_traceback(mreg: Any, model_dir: Path,
                                                                    store_root: Path) -> None:
    from registry import layout

    assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    (entry,) = [f for f in LocalStore(store_root).version("m", 1).manifest.artifacts[0].files
                if f.path == "model.safetensors"]
    for p in (layout.blob_path(store_root, entry.sha256),
              store_root / "models" / "m" / "versions" / "1" / "hf" / "model.safetensors"):
        p.unlink()  # both links to the bytes: the blob is gone
    r = mreg("convert", "m@1", "--to", "gguf:F16", "--json")
    assert r.exit_code == 4 and "missing from the store" in r.json["error"]["message"], r.stderr
    assert LocalStore(store_root).versions("m") == [1]


def test_a_digest_prefix_of_digits_only_finds_its_version(mreg: Any, model_dir: Path, store_root: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`m@1234567890` is version 1234567890 when there is one, else the version whose manifest digest starts so
    (about one ten-character prefix in a hundred is all digits: it made this module's test flaky)."""
    import dataclasses

    mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json")
    digits = "1234567890"
    version = LocalStore.version

    def with_digits(self: LocalStore, name: str, number: int) -> Any:
        v = version(self, name, number)
        return dataclasses.replace(v, manifest_sha256=digits + v.manifest_sha256[10:])

    monkeypatch.setattr(LocalStore, "version", with_digits)
    assert mreg("show", f"m@{digits}", "--json").json["version"] == 1
    assert mreg("show", "m@1", "--json").json["version"] == 1
    assert mreg("show", "m@7654321", "--json").exit_code == 3
