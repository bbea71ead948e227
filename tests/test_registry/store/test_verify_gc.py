"""`mreg verify` finds every kind of damage; `mreg gc` plans, then removes only the unreachable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.hostile import files, link_out, refused

from registry import atomic, layout
from registry.store.local import LocalStore


def _tamper(path: Path, data: bytes = b"X") -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(data)


def test_verify_clean_and_corrupt(mreg: Any, model_dir: Path, store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    r = mreg("verify", "m@1", "--json")
    assert r.exit_code == 0 and r.json["ok"] is True and r.json["versions"][0]["files"] == 2
    _tamper(store_root / "models/m/versions/1/hf/model.safetensors")
    r = mreg("verify", "m@1", "--json")
    assert r.exit_code == 4
    problems = r.json["versions"][0]["problems"]
    assert any(p.startswith("hf/model.safetensors: sha256") for p in problems)
    assert r.json["ok"] is False
    r = mreg("verify", "--all")
    assert r.exit_code == 4 and "failed verification: m@1" in r.stderr


def test_verify_missing_and_extra_files(mreg: Any, model_dir: Path, store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    vdir = store_root / "models/m/versions/1"
    os.unlink(vdir / "hf/config.json")
    (vdir / "hf/extra.bin").write_bytes(b"x")
    problems = mreg("verify", "m@1", "--json").json["versions"][0]["problems"]
    assert "hf/config.json: missing" in problems and "hf/extra.bin: not in the manifest" in problems


def test_verify_reports_a_linked_directory_that_is_not_in_the_manifest(mreg: Any, model_dir: Path,
                                                                       store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    os.symlink(model_dir, store_root / "models/m/versions/1/hf/more")  # the walk does not descend into it
    r = mreg("verify", "m@1", "--json")
    refused(r, "m@1")
    assert r.json["versions"][0]["problems"] == [
        f"hf/more: {store_root}/models/m/versions/1/hf/more is a symlink to {os.path.realpath(model_dir)} "
        "(outside the store), not in the manifest"]
    assert "remove each symlink" in r.json["error"]["hint"]


def test_verify_needs_a_target(mreg: Any) -> None:
    assert mreg("verify").exit_code == 2


def test_gc_plans_then_removes_only_unreachable(mreg: Any, model_dir: Path, store_root: Path) -> None:
    for i in range(5):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        mreg("convert", model_dir, "--to", "hf", "--name", "m")
    mreg("promote", "m@1")
    plan = mreg("gc", "--keep-latest", "1", "--keep-history", "1", "--json").json
    assert plan["applied"] is False
    assert [v["version"] for v in plan["versions"]] == [2, 3, 4]
    assert plan["blobs"] == 3  # the three configs; the shared weights stay
    assert LocalStore(store_root).versions("m") == [1, 2, 3, 4, 5], "a plan changes nothing"
    done = mreg("gc", "--keep-latest", "1", "--keep-history", "1", "--yes", "--json").json
    assert done["applied"] is True and len(done["versions"]) == 3
    store = LocalStore(store_root)
    assert store.versions("m") == [1, 5]
    assert mreg("verify", "--all").exit_code == 0
    assert (layout.version_dir(store_root, "m", 3) / layout.TOMBSTONE).exists()
    (model_dir / "config.json").write_text('{"i": 99}')
    assert mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json").json["version"] == 6, \
        "numbers of removed versions are never reused"
    r = mreg("show", "m@3")
    assert r.exit_code == 3


def test_gc_keeps_recent_history_targets(mreg: Any, model_dir: Path) -> None:
    for i in range(4):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        mreg("convert", model_dir, "--to", "hf", "--name", "m")
    mreg("promote", "m@1")
    mreg("promote", "m@2")
    plan = mreg("gc", "--keep-latest", "0", "--json").json
    kept = {k["version"]: k["why"] for k in plan["kept"]}
    assert kept[2] == "alias production" and "history" in kept[1]
    assert [v["version"] for v in plan["versions"]] == [3, 4]


def test_gc_removes_interrupted_staging_but_not_live_ones(mreg: Any, model_dir: Path, store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    store = LocalStore(store_root)
    dead = store.tmp / "stage-host-1-dead"
    (dead / "hf").mkdir(parents=True)
    (dead / "hf" / "partial").write_bytes(b"half")
    live = store.stage("m")
    try:
        plan = mreg("gc", "--json").json
        assert plan["staging"] == [str(dead)]
        assert mreg("gc", "--yes").exit_code == 0
        assert not dead.exists() and live.path.exists()
    finally:
        live.discard()


def test_the_next_writer_sweeps_what_a_killed_writer_left(store_root: Path) -> None:
    """A writer SIGKILLed mid-way leaves its staging tree; the next writer on this host removes it (its process is
    gone, its lock free), never a live tree or another host's."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time; from pathlib import Path; from registry.store.local import LocalStore\n"
            "s = LocalStore(Path(sys.argv[1])).stage('m'); (s.path / 'big').write_bytes(b'x' * 4096)\n"
            "print(s.path, flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(store_root)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.stdout is not None
    killed = Path(child.stdout.readline().strip())
    store = LocalStore(store_root)
    live = store.stage("m")  # the child is alive: its tree stays
    assert killed.exists()
    child.send_signal(signal.SIGKILL)
    child.wait()
    other = store.tmp / "stage-another-host-1-0123456789ab"
    other.mkdir()
    try:
        nxt = store.stage("m")
        assert not killed.exists() and not (store.tmp / (killed.name + ".lock")).exists()
        assert live.path.exists() and other.exists()
        nxt.discard()
    finally:
        live.discard()


def test_gc_refuses_while_a_publish_is_running(mreg: Any, model_dir: Path, store_root: Path) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    with atomic.flock(store_root / layout.GC_LOCK, shared=True):
        r = mreg("gc", "--yes")
    assert r.exit_code == 5 and "publish is in progress" in r.stderr


# -- links out of the store (issue #15) ------------------------------------------------------


def _two_versions(mreg: Any, model_dir: Path) -> None:
    for i in range(2):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0


def _fan_of_v1_config(store_root: Path) -> str:
    """The blob fan-out directory that holds version 1's config (a blob gc would remove)."""
    v1 = LocalStore(store_root).version("m", 1).manifest.artifacts[0]
    digest = next(f.sha256 for f in v1.files if f.path == "config.json")
    return layout.blob_path(store_root, digest).parent.relative_to(store_root).as_posix()


@pytest.mark.parametrize("where", ["models/m/versions/1", "models/m", "models/m/versions/1/hf", "blobs", "tmp"])
def test_gc_refuses_a_link_out_of_the_store_and_deletes_nothing(mreg: Any, model_dir: Path, store_root: Path,
                                                                 tmp_path: Path, where: str) -> None:
    _two_versions(mreg, model_dir)  # with --keep-latest 1 gc would remove version 1
    rel = {"blobs": _fan_of_v1_config(store_root), "tmp": "tmp/stage-host-1-dead"}.get(where, where)
    if where == "tmp":
        (store_root / rel / "hf").mkdir(parents=True)
        (store_root / rel / "hf/partial").write_bytes(b"half")
    outside = tmp_path / "outside"
    link_out(store_root, rel, outside)
    kept_outside, kept_store = files(outside), files(store_root)
    for dry in ([], ["--yes"]):
        r = mreg("gc", "--keep-latest", "1", "--keep-history", "0", *dry, "--json")
        refused(r, "symlink", rel)
    assert files(outside) == kept_outside, "gc deleted files outside the store"
    assert files(store_root) == kept_store, "gc deleted part of the store although it refused"


@pytest.mark.parametrize("where", ["models/m/versions/1", "models/m/versions/1/hf",
                                   "models/m/versions/1/hf/config.json"])
def test_verify_reports_a_link_out_of_the_store(mreg: Any, model_dir: Path, store_root: Path, tmp_path: Path,
                                                where: str) -> None:
    mreg("convert", model_dir, "--to", "hf", "--name", "m")
    outside = tmp_path / "outside"
    link_out(store_root, where, outside)
    kept = files(outside)
    for args in (["m@1"], ["--all"]):
        r = mreg("verify", *args, "--json")
        refused(r, "m@1")
        (report,) = r.json["versions"]
        assert report["ok"] is False and (report["version"], report["name"]) == (1, "m")
        assert any("symlink" in p and str(outside) in p for p in report["problems"]), report["problems"]
    if not where.endswith(".json"):  # a version read through a link: every reader refuses it
        refused(mreg("show", "m@1", "--json"), "symlink")
        refused(mreg("resolve", "m@1", "--json"), "symlink")
    assert files(outside) == kept
