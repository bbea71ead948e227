"""Signatures travel with push and sync (real S3 on loopback); a serving node with a trust policy refuses to flip to
a version whose signatures fail it, before anything is downloaded."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.pki import write_key
from support.s3_server import SeaweedS3, running

BUCKET = "mreg-sign"


@pytest.fixture(scope="module")
def s3server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server for the module."""
    with running(tmp_path_factory.mktemp("seaweed"), BUCKET) as server:
        yield server


@pytest.fixture
def remote(s3server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix, credentials and endpoint in the environment."""
    for k, v in s3server.env.items():
        monkeypatch.setenv(k, v)
    return f"s3://{BUCKET}/p{random.randrange(1 << 30)}"


@pytest.mark.slow
def test_signatures_round_trip_and_sync_refuses_a_failing_version(mreg: Any, model_dir: Path, remote: str,
                                                                  tmp_path: Path, isolated: Path) -> None:
    release, _ = write_key(tmp_path / "pki", "release")
    stranger, _ = write_key(tmp_path / "pki", "stranger")
    for i in range(2):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    ok(mreg("sign", "m@1", "--key", release.private, "--signer", "release", "--json"))
    ok(mreg("sign", "m@2", "--key", stranger.private, "--signer", "mallory", "--json"))
    assert ok(mreg("push", "m@1", remote, "--json"))["signatures"] == 1
    assert ok(mreg("push", "m@2", remote, "--json"))["signatures"] == 1
    assert ok(mreg("push", "m@1", remote, "--json"))["signatures"] == 0, "a record is sent once"

    cfg = isolated / "home/.config/mreg/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[trust]\nkeys = ["{release.public}"]\n')
    shown = ok(mreg("show", "m@1", "--store", remote, "--json"))["signatures"]
    assert [(s["signer"], s["status"]) for s in shown] == [("release", "valid")]
    doc = ok(mreg("verify", "m@1", "--signatures", "--store", remote, "--json"))
    assert doc["versions"][0]["signed"] is True
    r = mreg("promote", "m@2", "--require", "signature", "--store", remote, "--json")
    assert r.exit_code == 6 and "mallory" in r.json["error"]["message"]
    ok(mreg("promote", "m@1", "--require", "signature", "--store", remote, "--json"))

    node = tmp_path / "node"
    assert ok(mreg("sync", remote, "m", "--store", node, "--json"))["version"] == 1
    assert len(list((node / "models/m/signatures/1").glob("*.json"))) == 1, "the record came with the version"
    assert ok(mreg("verify", "m@1", "--signatures", "--store", node, "--json"))["versions"][0]["signed"]

    # The remote alias moves to a version only an untrusted key signed: the node refuses, nothing is written.
    ok(mreg("promote", "m@2", "--store", remote, "--json"))
    r = mreg("sync", remote, "m", "--store", node, "--json")
    assert r.exit_code == 6 and r.json["error"]["type"] == "GateRefused"
    assert "mallory" in r.json["error"]["message"] and "release.pub" in r.json["error"]["message"]
    assert (node / "models/m/production").readlink() == Path("versions/1")
    assert not (node / "models/m/versions/2").exists(), "nothing downloaded"
    # Without a policy the node follows (the policy is the node's choice).
    cfg.write_text("")
    assert ok(mreg("sync", remote, "m", "--store", node, "--json"))["version"] == 2


@pytest.mark.slow
def test_a_signature_stays_behind_when_the_remote_number_differs(mreg: Any, model_dir: Path, remote: str,
                                                                 tmp_path: Path) -> None:
    """The number is in the signed manifest: pushed as another number, the version is not what was signed."""
    release, _ = write_key(tmp_path / "pki", "release")
    for i in range(2):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    ok(mreg("sign", "m@2", "--key", release.private, "--json"))
    doc = ok(mreg("push", "m@2", remote, "--json"))
    assert doc["remote_version"] == 1 and doc["signatures"] == 0 and doc["signatures_left"] == 1
    assert ok(mreg("show", "m@1", "--store", remote, "--json"))["signatures"] == []
    assert "left behind" in mreg("push", "m@2", remote).stdout


def test_a_remote_record_that_disagrees_with_its_key_is_refused(mreg: Any, model_dir: Path, remote: str,
                                                                tmp_path: Path) -> None:
    """A record under models/m/signatures/1/ that names another model (a path out of the node's store) fails the
    sync (exit 4) before anything is written."""
    from registry.store.s3 import S3Store

    ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    release, _ = write_key(tmp_path / "pki", "release")
    ok(mreg("sign", "m@1", "--key", release.private, "--json"))
    ok(mreg("push", "m@1", remote, "--json"))
    ok(mreg("promote", "m@1", "--store", remote, "--json"))
    rs = S3Store(remote)
    [key] = rs.signature_keys("m", 1)
    obj = rs.get(key)
    assert obj is not None
    doc = json.loads(obj.data)
    doc["name"] = "../../../escape"
    rs.put(key, json.dumps(doc).encode())
    node = tmp_path / "node"
    r = mreg("sync", remote, "m", "--store", node, "--json")
    assert r.exit_code == 4 and "not m@1" in r.json["error"]["message"]
    assert not (node / "models/m/production").exists() and not (tmp_path / "escape").exists()


@pytest.mark.slow
def test_a_watch_round_with_the_alias_unchanged_downloads_and_verifies_nothing(
        mreg: Any, model_dir: Path, remote: str, tmp_path: Path, isolated: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 1 syncs (manifest, signatures, blobs; the signature verified), round 2 finds the alias record as it
    was and reads only that, round 3 follows a promotion."""
    import threading

    from registry import api
    from registry.release import aliases
    from registry.store import s3_transfer
    from registry.store.bucket import Bucket
    from registry.store.local import LocalStore
    from registry.store.s3 import S3Store

    release, _ = write_key(tmp_path / "pki", "release")
    for i in range(2):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
        ok(mreg("sign", f"m@{i + 1}", "--key", release.private, "--json"))
        ok(mreg("push", f"m@{i + 1}", remote, "--json"))
    ok(mreg("promote", "m@1", "--store", remote, "--json"))
    cfg = isolated / "home/.config/mreg/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[trust]\nkeys = ["{release.public}"]\n')
    trust = api.trust_policy(api.settings(), "m")

    judged: list[str] = []
    fetched: list[str] = []  # every GET or LIST but the alias records' (what a round reads to know it is unchanged)
    real_judge, real_get, real_list = s3_transfer.judge, Bucket._get_object, Bucket.list_objects

    def judge(*args: Any, **kwargs: Any) -> Any:
        judged.append(args[0].signer)
        return real_judge(*args, **kwargs)

    def get_object(self: Bucket, key: str, *args: Any, **kwargs: Any) -> Any:
        if "/aliases/" not in key:
            fetched.append(key)
        return real_get(self, key, *args, **kwargs)

    def list_objects(self: Bucket, prefix: str, **kwargs: Any) -> Any:
        fetched.append(prefix)
        return real_list(self, prefix, **kwargs)

    monkeypatch.setattr(s3_transfer, "judge", judge)
    monkeypatch.setattr(Bucket, "_get_object", get_object)
    monkeypatch.setattr(Bucket, "list_objects", list_objects)
    rs, node = S3Store(remote), LocalStore(tmp_path / "node")
    rounds: list[tuple[int, int]] = []

    class Rounds(threading.Event):
        """The watch's pause between rounds: counts what each round read; promotes m@2 after round 2."""

        def wait(self, timeout: float | None = None) -> bool:
            rounds.append((len(judged), len(fetched)))
            if len(rounds) == 2:
                monkeypatch.setattr(Bucket, "_get_object", real_get)  # the promotion's own reads are not the watch's
                aliases.promote(rs, "m", rs.version("m", 2))
                monkeypatch.setattr(Bucket, "_get_object", get_object)
            if len(rounds) == 3:
                self.set()
            return self.is_set()

    changes: list[int] = []
    errors: list[Exception] = []
    api.watch(node, rs, "m", alias="production", every=0, on_change=lambda o: changes.append(o.version),
              stop=Rounds(), on_error=errors.append, trust=trust)
    assert errors == [] and changes == [1, 2] and node.alias("m", "production") == 2
    (j1, f1), (j2, f2), (j3, f3) = rounds
    assert j1 == 1 and f1 > 0, "round 1 read the manifest, the signatures and the blobs, and verified"
    assert (j2, f2) == (j1, f1), "round 2: the alias record unchanged, nothing downloaded, nothing verified"
    assert j3 == 2 and f3 > f2, "round 3 follows the promotion"
