"""Resumable chunked uploads against the real distribution registry: a push killed mid-blob, then repeated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry, killed_push
from support.tiny_models import write_random_safetensors

TESTS = Path(__file__).resolve().parents[2]
CHUNK = 128 << 10
WEIGHTS = 1 << 20  # tensor bytes: eight chunks and a header
KILL_AFTER = 300_000  # bytes the progress has heard of: three chunks of the weights, and the small blobs


@pytest.fixture
def repo(registry: LocalRegistry, request: pytest.FixtureRequest) -> str:
    return f"oci://{registry.host}/t/{request.node.name.lower().replace('_', '-')}"


def _published(mreg: Any, tmp_path: Path) -> dict[str, Any]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_random_safetensors(src / "model.safetensors", WEIGHTS, 3)
    ok(mreg("convert", src, "--to", "hf", "--name", "m", "--json"))
    manifest: dict[str, Any] = json.loads((tmp_path / "store/models/m/versions/1/manifest.json").read_text())
    return next(f for f in manifest["artifacts"][0]["files"] if f["path"] == "model.safetensors")


def _killed_push(tmp_path: Path, target: str) -> None:
    """A push in a child process, SIGKILLed by its own progress after KILL_AFTER bytes (between two chunks)."""
    killed_push(tmp_path / "store", "m@1", target, after=KILL_AFTER, chunk=CHUNK)


def _sessions(store: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((store / "tmp/oci-uploads").glob("*.json"))]


def _registry_upload_bytes(registry: LocalRegistry, repository: str) -> list[int]:
    """The size of every upload the registry holds open for a repository (its own record of what it has)."""
    uploads = registry.storage / "docker/registry/v2/repositories" / repository / "_uploads"
    return sorted(p.stat().st_size for p in uploads.glob("*/data"))


def test_push_killed_mid_blob_resumes_that_blob(mreg: Any, tmp_path: Path, repo: str,
                                                registry: LocalRegistry) -> None:
    weights = _published(mreg, tmp_path)
    _killed_push(tmp_path, f"{repo}:v1")
    [session] = _sessions(tmp_path / "store")
    size = weights["size"]
    assert session["digest"] == f"sha256:{weights['sha256']}" and session["size"] == size
    confirmed = session["confirmed"]
    assert confirmed > 0 and confirmed % CHUNK == 0 and confirmed < size
    assert set(session) == {"schema_version", "target", "digest", "size", "location", "confirmed", "updated"}
    repository = repo.split("/", 3)[3]
    assert _registry_upload_bytes(registry, repository) == [confirmed], "the registry holds what was confirmed"

    from registry import api

    done = api.push(api.open_local_store(tmp_path / "store"), "m@1", f"{repo}:v1", insecure=True, chunk=CHUNK)
    assert done.resumed_bytes == confirmed
    # The config and config.json went whole before the kill; now the rest of the weights and mreg's manifest.
    own = (tmp_path / "store/models/m/versions/1/manifest.json").stat().st_size
    assert (done.uploaded_blobs, done.uploaded_bytes) == (2, size - confirmed + own)
    assert not _sessions(tmp_path / "store"), "a finished blob's session is removed"
    cache2 = tmp_path / "cache2"
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", cache2, "--json"))["files"] == 2
    [snap] = cache2.glob("*/snapshots/*/model.safetensors")
    assert snap.read_bytes() == (tmp_path / "src/model.safetensors").read_bytes()


def test_a_session_the_registry_forgot_starts_the_blob_again(mreg: Any, tmp_path: Path, repo: str,
                                                            registry: LocalRegistry) -> None:
    _published(mreg, tmp_path)
    _killed_push(tmp_path, f"{repo}:v1")
    assert len(_sessions(tmp_path / "store")) == 1
    repository = repo.split("/", 3)[3]
    shutil.rmtree(registry.storage / "docker/registry/v2/repositories" / repository / "_uploads")  # purged
    pushed = ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    assert pushed["resumed_bytes"] == 0 and pushed["uploaded_bytes"] >= WEIGHTS
    assert not _sessions(tmp_path / "store")
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", tmp_path / "cache2", "--json"))["files"] == 2


def test_gc_removes_the_sessions_of_a_push_that_is_not_running(mreg: Any, tmp_path: Path, repo: str) -> None:
    _published(mreg, tmp_path)
    _killed_push(tmp_path, f"{repo}:v1")
    assert len(_sessions(tmp_path / "store")) == 1
    planned = ok(mreg("gc", "--dry-run", "--json"))
    assert str(tmp_path / "store/tmp/oci-uploads") in planned["staging"]
    from registry.oci import uploads

    with uploads.pushing(tmp_path / "store"):  # a push is running: its sessions stay
        assert str(tmp_path / "store/tmp/oci-uploads") not in ok(mreg("gc", "--dry-run", "--json"))["staging"]
    ok(mreg("gc", "--yes", "--json"))
    assert not (tmp_path / "store/tmp/oci-uploads").exists()


def test_a_planted_session_is_never_followed_off_the_registry(mreg: Any, tmp_path: Path, repo: str) -> None:
    """A session file is local state, not trusted: one naming another origin (where our Authorization would go) or
    one that does not parse is dropped, and the blob is sent from its first byte."""
    weights = _published(mreg, tmp_path)
    from registry.oci.uploads import UploadSessions

    target = repo.removeprefix("oci://")
    sessions = UploadSessions(tmp_path / "store/tmp/oci-uploads", target)
    sessions.save(f"sha256:{weights['sha256']}", weights["size"], "http://127.0.0.2:9/v2/elsewhere/uploads/x",
                  CHUNK)
    config_json = next(f for f in json.loads((tmp_path / "store/models/m/versions/1/manifest.json").read_text())
                       ["artifacts"][0]["files"] if f["path"] == "config.json")
    sessions._path(f"sha256:{config_json['sha256']}").write_text("{not json")
    from registry import api

    done = api.push(api.open_local_store(tmp_path / "store"), "m@1", f"{repo}:v1", insecure=True, chunk=CHUNK)
    assert done.resumed_bytes == 0 and not _sessions(tmp_path / "store")
    assert not list((tmp_path / "store/tmp/oci-uploads").glob("*.json"))
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", tmp_path / "cache2", "--json"))["files"] == 2


def test_sigterm_stops_at_a_chunk_boundary_and_the_push_resumes(mreg: Any, tmp_path: Path, repo: str) -> None:
    """The CLI's handler: one SIGTERM (a CI job cancelled, a pod stopped) lets the PATCH in flight finish, so the
    session matches what distribution holds and the next push resumes it, instead of losing it mid-body."""
    weights = _published(mreg, tmp_path)
    script = (
        "import os, signal, sys, threading, time\n"
        "from registry import api\n"
        "from registry.cli.remote import stop_on_signals\n"
        "from registry.cli.render import Output\n"
        "from registry.errors import Interrupted\n"
        "class Terminator:\n"
        "    seen = 0\n"
        "    def start(self, *a, **k): pass\n"
        "    def done(self): pass\n"
        "    def advance(self, n):\n"
        "        Terminator.seen += n\n"
        f"        if Terminator.seen > {KILL_AFTER} and not hasattr(Terminator, 'sent'):\n"
        "            Terminator.sent = threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGTERM))\n"
        "            Terminator.sent.start()\n"
        "store = api.open_local_store(sys.argv[1])\n"
        "with stop_on_signals(Output(False)) as stop:\n"
        "    try:\n"
        f"        api.push(store, 'm@1', sys.argv[2], insecure=True, progress=Terminator(), chunk={CHUNK},\n"
        "                     stop=stop)\n"
        "    except Interrupted as e:\n"
        "        print(e, file=sys.stderr); sys.exit(e.exit_code)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    stopped = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store"), f"{repo}:v1"], env=env,
                             timeout=60, check=False, capture_output=True, text=True)
    assert stopped.returncode == 130, stopped.stderr
    assert "SIGTERM: stopping after the chunk" in stopped.stderr and "nothing is tagged" in stopped.stderr
    [session] = _sessions(tmp_path / "store")
    assert 0 < session["confirmed"] < weights["size"]
    pushed = ok(mreg("push", "m@1", f"{repo}:v1", "--insecure", "--json"))
    assert pushed["resumed_bytes"] == session["confirmed"]
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", tmp_path / "cache2", "--json"))["files"] == 2


def test_a_second_push_of_the_same_blob_does_not_share_the_first_ones_session(mreg: Any, tmp_path: Path,
                                                                             repo: str) -> None:
    """Two writers on one distribution session make it cancel the upload: while a push holds a blob's session,
    another push of it sends the blob on its own and records nothing."""
    weights = _published(mreg, tmp_path)
    _killed_push(tmp_path, f"{repo}:v1")
    [before] = _sessions(tmp_path / "store")
    from registry import api
    from registry.oci.uploads import UploadSessions

    sessions = UploadSessions(tmp_path / "store/tmp/oci-uploads", repo.removeprefix("oci://"))
    with sessions.claim(f"sha256:{weights['sha256']}") as mine:  # as if the killed push were still running
        assert mine
        done = api.push(api.open_local_store(tmp_path / "store"), "m@1", f"{repo}:v1", insecure=True,
                            chunk=CHUNK)
        assert done.resumed_bytes == 0 and _sessions(tmp_path / "store") == [before]  # untouched
    assert ok(mreg("pull", f"{repo}:v1", "--insecure", "--cache-dir", tmp_path / "cache2", "--json"))["files"] == 2
