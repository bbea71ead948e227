"""A local directory imported without a copy: linked in place, trusted only while its files are unchanged."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.cache import load_record, pull_local
from registry.cache import local as local_import
from registry.convert.execute import convert
from registry.errors import IntegrityError
from registry.store.local import LocalStore

#: A shorter racy window than the default 2 s, so a test need not wait: ext4's timestamps tick every few ms.
RACY_S = 0.2


@pytest.fixture
def settled(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The model directory, last written longer ago than the racy window (so an import links it)."""
    monkeypatch.setattr(local_import, "RACY_S", RACY_S)
    time.sleep(RACY_S + 0.05)
    yield model_dir


def _cache_files(cache_root: Path) -> list[Path]:
    """The regular files in the cache's blobs (what an import copied)."""
    return [p for p in cache_root.rglob("*") if "blobs" in p.parts and p.is_file() and not p.is_symlink()]


def _edit_in_place(path: Path) -> None:
    """Change a file's last bytes without changing its size, inode or mtime (only ctime can tell)."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"tampered")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_local_directory_is_linked_in_place_and_stored_as_copies(
        mreg: Any, settled: Path, cache_root: Path, store_root: Path) -> None:
    weights = settled / "model.safetensors"
    mode = stat.S_IMODE(weights.stat().st_mode)
    doc = mreg("pull", settled, "--json").json
    assert doc["linked"] is True and doc["from_cache"] is False
    assert _cache_files(cache_root) == [], "nothing was copied into the cache"
    assert (Path(doc["snapshot"]) / "model.safetensors").resolve() == weights
    assert "linked in place" in mreg("pull", settled).stdout

    r = mreg("convert", settled, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr
    stored = Path(r.json["path"]) / "hf" / "model.safetensors"
    assert stored.read_bytes() == weights.read_bytes()
    assert stored.stat().st_ino != weights.stat().st_ino, "the user's file is never hard-linked into the store"
    assert stat.S_IMODE(weights.stat().st_mode) == mode, "the user's file is untouched"
    assert mreg("verify", "m@1").exit_code == 0


def test_a_file_changed_after_a_linked_import_is_never_taken_for_the_old_bytes(
        mreg: Any, settled: Path, cache_root: Path) -> None:
    first = mreg("pull", settled, "--json").json
    _edit_in_place(settled / "model.safetensors")
    assert load_record(cache_root, first["repo"], first["commit"]) is None, "the old snapshot is unusable"
    again = mreg("pull", settled, "--json").json
    assert again["from_cache"] is False and again["commit"] != first["commit"], "read and hashed again"


def test_a_file_changed_while_it_is_converted_publishes_nothing(
        settled: Path, cache_root: Path, store_root: Path) -> None:
    snap = pull_local(cache_root, settled)
    assert snap.linked
    _edit_in_place(settled / "model.safetensors")  # after the hash, before the conversion ends
    store = LocalStore(store_root)
    with pytest.raises(IntegrityError, match="changed since it was pulled"):  # the verified copy into the store
        convert(store, snap, "m", [("hf", {})])
    assert not store.has_model("m") or not list((store_root / "models" / "m" / "versions").iterdir())
    with pytest.raises(IntegrityError, match=r"model\.safetensors in .* changed while mreg was using it"):
        snap.check_unchanged()  # what every conversion asks before it publishes


def test_copy_keeps_the_bytes_in_the_cache_and_is_kept_by_later_imports(
        mreg: Any, settled: Path, cache_root: Path) -> None:
    linked = mreg("pull", settled, "--json").json
    copied = mreg("pull", settled, "--copy", "--json").json
    assert copied["linked"] is False and copied["commit"] == linked["commit"], "the same bytes, the same commit"
    snapshot = Path(copied["snapshot"])
    entry = snapshot / "model.safetensors"
    assert not os.readlink(entry).startswith("/") and entry.resolve().parent.name == "blobs"
    assert entry.read_bytes() == (settled / "model.safetensors").read_bytes()
    kept = mreg("pull", settled, "--json").json
    assert kept["linked"] is False and kept["from_cache"] is True, "an existing copy is not traded for links"

    # the directory goes away: the copy still serves the snapshot
    moved = settled.with_name("elsewhere")
    settled.rename(moved)
    assert load_record(cache_root, copied["repo"], copied["commit"]) is not None
    moved.rename(settled)


def test_a_flip_killed_midway_leaves_nothing_behind_the_next_one(
        mreg: Any, settled: Path, cache_root: Path) -> None:
    """Links are flipped one by one (symlink to a temporary name, then rename over the entry): the temporary link
    of a flip killed between the two is hidden, and swept by the next flip of that snapshot."""
    import subprocess
    import sys

    from registry import atomic

    snapshot = Path(mreg("pull", settled, "--json").json["snapshot"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    left = atomic.temp_name(snapshot / "model.safetensors", "link")
    left = left.with_name(left.name.replace(f"-{os.getpid()}-", f"-{dead}-"))
    os.symlink("/nowhere", left)
    mine = atomic.temp_name(snapshot / "config.json", "link")  # a live writer's (this process): kept
    os.symlink("/nowhere", mine)
    assert mreg("pull", settled, "--copy", "--json").json["linked"] is False
    assert not os.path.lexists(left) and os.path.lexists(mine)
    assert sorted(p.name for p in snapshot.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in settled.iterdir())
    mine.unlink()


def test_a_linked_snapshot_whose_directory_is_gone_is_not_served(
        mreg: Any, settled: Path, cache_root: Path) -> None:
    doc = mreg("pull", settled, "--json").json
    settled.rename(settled.with_name("elsewhere"))
    assert load_record(cache_root, doc["repo"], doc["commit"]) is None


def test_a_directory_written_moments_ago_is_copied(mreg: Any, model_dir: Path, cache_root: Path) -> None:
    """Within the racy window a second write could keep every timestamp: linking would be a guess."""
    doc = mreg("pull", model_dir, "--json").json
    assert doc["linked"] is False and _cache_files(cache_root)


def test_a_file_written_while_it_is_hashed_refuses_the_import(
        mreg: Any, settled: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer appends while mreg reads: the hash is of neither version, so nothing is imported (exit 8)."""
    from registry.cache import local

    real = local.sha256_file

    def hash_then_someone_writes(path: Path, *args: Any) -> str:
        digest = real(path, *args)
        if path.name == "model.safetensors":
            with path.open("ab") as f:
                f.write(b"more")
        return digest

    monkeypatch.setattr(local, "sha256_file", hash_then_someone_writes)
    r = mreg("pull", settled, "--json")
    assert r.exit_code == 8 and "changed while it was being read" in r.json["error"]["message"], r.stdout
    assert r.json["error"]["hint"] and not list(cache_root.rglob("*.json")), "no record, no ref"
