"""Serving: promotion hooks with automatic flip-back, and the mount contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.hostile import files, link_out, refused


class FileEngine:
    """A minimal serving loop: on /reload it loads config.json from the mount path; /ready says whether it could."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.loaded: dict[str, Any] | None = None
        self.reloads = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                engine.reload()
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                if self.path == "/ready":
                    ok = engine.loaded is not None
                    self.send_response(200 if ok else 503)
                    self.end_headers()
                else:
                    body = json.dumps(engine.loaded).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reload(self) -> None:
        """Load the model at the mount path; a broken one leaves the engine not ready."""
        self.reloads += 1
        try:
            doc = json.loads((self.mount / "hf" / "config.json").read_text())
        except (OSError, ValueError):
            doc = {"broken": True}
        self.loaded = None if doc.get("broken") else doc

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()


@pytest.fixture
def versions(mreg: Any, model_dir: Path) -> str:
    """Model `m`: versions 1 and 2 are good, 3 is broken."""
    for cfg in ({"i": 1}, {"i": 2}, {"broken": True}):
        (model_dir / "config.json").write_text(json.dumps(cfg))
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    return "m"


@pytest.fixture
def engine(store_root: Path) -> Iterator[FileEngine]:
    """An engine that mounts models/m/production."""
    e = FileEngine(store_root / "models" / "m" / "production")
    yield e
    e.close()


@pytest.mark.slow
def test_reload_ready_and_automatic_flip_back(mreg: Any, versions: str, engine: FileEngine) -> None:
    hooks = ["--reload-url", f"{engine.url}/reload", "--ready-url", f"{engine.url}/ready", "--ready-timeout", "2"]
    r = mreg("promote", "m@1", *hooks, "--json")
    assert r.exit_code == 0 and r.json["hooks"]["ready"] is True
    assert engine.loaded == {"i": 1}
    assert mreg("promote", "m@2", *hooks).exit_code == 0 and engine.loaded == {"i": 2}
    r = mreg("promote", "m@3", *hooks, "--json")
    assert r.exit_code == 10
    assert "flipped back to 2" in r.json["error"]["message"]
    assert mreg("show", "m@production", "--json").json["version"] == 2
    assert engine.loaded == {"i": 2}, "the engine was reloaded onto the old version and serves it"
    hist = mreg("history", "m", "--json").json["entries"]
    assert [(e["action"], e["from"], e["to"]) for e in hist][-2:] == [("promote", 2, 3), ("rollback", 3, 2)]
    assert hist[-1]["reason"].startswith("automatic flip-back: m@3 not ready")


def test_reload_command_sees_the_version(mreg: Any, versions: str, tmp_path: Path) -> None:
    log = tmp_path / "reloads"
    cmd = f'echo "$MREG_NAME $MREG_ALIAS $MREG_FROM_VERSION->$MREG_VERSION $MREG_PATH" >> {log}'
    assert mreg("promote", "m@1", "--reload", cmd).exit_code == 0
    assert mreg("promote", "m@2", "--reload", cmd, "--ready-cmd", f"test -s {log}").exit_code == 0
    lines = log.read_text().splitlines()
    assert lines[0].startswith("m production ->1 ") and lines[1].startswith("m production 1->2 ")
    assert lines[1].endswith("/models/m/production")
    r = mreg("promote", "m@1", "--reload", "echo boom >&2; exit 3")
    assert r.exit_code == 10 and "reload command exited 3: boom" in r.stderr
    assert mreg("show", "m@production", "--json").json["version"] == 2


@pytest.mark.slow
def test_hooks_from_the_config_file(mreg: Any, versions: str, engine: FileEngine, tmp_path: Path) -> None:
    cfg = tmp_path / "mreg.toml"
    cfg.write_text(f'[models.m]\nreload_url = "{engine.url}/reload"\nready_url = "{engine.url}/ready"\n'
                   "ready_timeout = 1\n")
    assert mreg("promote", "m@1", "--config", cfg).exit_code == 0 and engine.loaded == {"i": 1}
    assert mreg("promote", "m@3", "--config", cfg).exit_code == 10
    assert mreg("promote", "m@2", "--config", cfg, "--ready-timeout", "3").exit_code == 0
    cfg.write_text('[models.m]\nreload_ur = "typo"\n')
    r = mreg("promote", "m@1", "--config", cfg)
    assert r.exit_code == 2 and "reload_ur" in r.stderr


def test_first_promotion_that_fails_says_there_is_nothing_to_flip_back_to(mreg: Any, versions: str) -> None:
    r = mreg("promote", "m@3", "--ready-cmd", "false", "--ready-timeout", "0.5")
    assert r.exit_code == 10 and "no earlier version" in r.stderr


def test_mount_check(mreg: Any, versions: str, store_root: Path) -> None:
    mreg("promote", "m@2")
    doc = mreg("mount-check", "m", "--mount-root", "/models", "--json").json
    assert doc["ok"] is True and doc["version"] == 2
    assert doc["paths"] == {"hf": "/models/models/m/production/hf"}
    assert mreg("mount-check", "m", "--verify").exit_code == 0
    link = store_root / "models/m/production"
    os.unlink(link)
    os.symlink(store_root / "models/m/versions/2", link)  # what `ln -sfn $PWD/...` does
    r = mreg("mount-check", "m", "--json")
    assert r.exit_code == 1 and "is absolute" in r.json["problems"][0]
    os.unlink(link)
    outside = store_root.parent / "elsewhere"
    shutil.copytree(store_root / "models/m/versions/2", outside)
    os.symlink(os.path.relpath(outside, link.parent), link)
    assert "outside the store root" in " ".join(mreg("mount-check", "m", "--json").json["problems"])
    assert mreg("mount-check", "m", "--alias", "staging").exit_code == 1


def test_mount_check_verify_of_damaged_bytes_is_an_integrity_failure(mreg: Any, versions: str,
                                                                     store_root: Path) -> None:
    """`--verify` found damaged bytes but exited 1 like any contract violation: it is exit 4, as `verify` says."""
    mreg("promote", "m@2")
    config = store_root / "models/m/versions/2/hf/config.json"
    os.chmod(config, 0o644)
    config.write_text('{"tampered": true}')
    r = mreg("mount-check", "m", "--verify", "--json")
    assert r.exit_code == 4 and r.json["ok"] is False, r.stderr
    assert "do not match their digests" in r.stderr


@pytest.mark.parametrize("where", ["versions/2", "versions/2/hf", "versions/2/hf/config.json"])
def test_mount_check_refuses_a_link_out_of_the_store(mreg: Any, versions: str, store_root: Path, tmp_path: Path,
                                                     where: str) -> None:
    mreg("promote", "m@2")
    outside = tmp_path / "outside"
    link_out(store_root / "models/m", where, outside)
    kept = files(outside)
    for full in ([], ["--verify"]):
        r = mreg("mount-check", "m", *full, "--json")
        refused(r, "m production")
        assert r.json["ok"] is False
        assert any("symlink" in p and str(outside) in p for p in r.json["problems"]), r.json["problems"]
    assert files(outside) == kept


def test_alias_resolves_inside_a_bind_mount_and_sub_mounts_are_flagged(mreg: Any, versions: str,
                                                                       store_root: Path, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not permitted here: {probe.stderr.decode().strip()}")
    mreg("promote", "m@2")
    mnt = tmp_path / "container-models"
    mnt.mkdir()
    mreg_bin = Path(sys.executable).parent / "mreg"
    script = f"""
set -e
mount --bind {store_root} {mnt}
mount -o remount,bind,ro {mnt}
cat {mnt}/models/m/production/hf/config.json
echo
{mreg_bin} mount-check m --store {mnt} --json
mkdir -p {store_root}/models/m/pinned
mount --bind {store_root}/models/m/versions/1 {store_root}/models/m/pinned
{mreg_bin} mount-check m --store {store_root} --json || true
"""
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert json.loads(lines[0]) == {"i": 2}, "the relative alias resolves inside the read-only bind mount"
    inside = json.loads(lines[1])
    assert inside["ok"] is True and inside["paths"]["hf"] == f"{mnt}/models/m/production/hf"
    flagged = json.loads(lines[2])
    assert flagged["ok"] is False and "separate mount" in " ".join(flagged["problems"])
