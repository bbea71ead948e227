"""The S3 store against a real S3 server on loopback (SeaweedFS): push, promote, rollback, sync, verify, gc."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import workers
from support.hostile import files, refused
from support.s3_server import SeaweedS3, running
from support.tiny_models import write_random_safetensors

from registry import layout
from registry.store.local import LocalStore
from registry.store.s3 import S3Store
from registry.store.s3_transfer import S3Sink, S3Source
from registry.store.transfer import push, sync

BUCKET = "mreg-test"
TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server for the module; each test uses its own prefix."""
    with running(tmp_path_factory.mktemp("seaweed"), BUCKET) as server:
        yield server


@pytest.fixture
def s3env(s3server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Credentials and endpoint in the environment, as boto3's standard chain reads them."""
    for k, v in s3server.env.items():
        monkeypatch.setenv(k, v)
    return s3server.env


@pytest.fixture
def remote_url(s3env: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A fresh prefix in the test bucket."""
    return f"s3://{BUCKET}/{request.node.name.replace('[', '-').replace(']', '')}-{random.randrange(1 << 30)}"


def _versions(mreg: Any, model_dir: Path, name: str, n: int) -> None:
    for i in range(n):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        assert mreg("convert", model_dir, "--to", "hf", "--name", name).exit_code == 0


def _pushed_first_promoted(mreg: Any, model_dir: Path, remote_url: str, n: int = 3) -> None:
    """m@1..n pushed to the remote, production -> 1 there."""
    _versions(mreg, model_dir, "m", n)
    for v in range(1, n + 1):
        mreg("push", f"m@{v}", remote_url)
    mreg("promote", "m@1", "--store", remote_url)


@pytest.mark.slow
def test_push_promote_rollback_verify(mreg: Any, model_dir: Path, remote_url: str) -> None:
    _versions(mreg, model_dir, "m", 2)
    first = mreg("push", "m@1", remote_url, "--json")
    assert first.exit_code == 0, first.stderr
    assert first.json["remote_version"] == 1 and first.json["uploaded_blobs"] == 2
    again = mreg("push", "m@1", remote_url, "--json").json
    assert again["reused"] is True and again["uploaded_bytes"] == 0
    second = mreg("push", "m@2", remote_url, "--json").json
    assert second["uploaded_blobs"] == 1 and second["present_blobs"] == 1, "the shared weights are not re-sent"
    st = ["--store", remote_url]
    assert mreg("list", *st, "--json").json["models"] == [{"name": "m", "versions": 2, "aliases": {}}]
    assert mreg("promote", "m@1", *st, "-m", "go").exit_code == 0
    assert mreg("promote", "m@2", *st, "--expect", "1").exit_code == 0
    lost = mreg("promote", "m@1", *st, "--expect", "1", "--json")
    assert lost.exit_code == 5 and lost.json["error"]["type"] == "Conflict"
    assert mreg("rollback", "m", *st, "--json").json["to"] == 1
    assert mreg("show", "m@production", *st, "--json").json["version"] == 1
    hist = mreg("history", "m", *st, "--json").json["entries"]
    assert [(e["action"], e["from"], e["to"]) for e in hist] == [("promote", None, 1), ("promote", 1, 2),
                                                                  ("rollback", 2, 1)]
    assert mreg("verify", "--all", *st, "--json").json["ok"] is True
    assert mreg("resolve", "m@production", *st, "--json").json["path"].startswith(remote_url)
    assert mreg("show", "m@9", *st).exit_code == 3


@pytest.mark.slow
def test_no_lost_update_under_ten_concurrent_promoters(mreg: Any, model_dir: Path, remote_url: str,
                                                      s3env: dict[str, str], tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=workers.s3_promoter, args=(remote_url, "m", [1, 2, 3], 6, seed,
                                                           str(tmp_path / f"p{seed}.json")))
             for seed in range(10)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    results = [json.loads((tmp_path / f"p{s}.json").read_text()) for s in range(10)]
    won = sum(r["won"] for r in results)
    lost = sum(r["lost"] for r in results)
    assert won + lost + sum(r["noop"] for r in results) == 60
    assert lost > 0, "with ten racers some must lose"
    assert all(r["other_errors"] == [] for r in results), results
    store = S3Store(remote_url)
    history = store.history("m")
    assert len(history) == won + 1, "no lost update: one history entry per winning promotion"
    assert history[-1].to_version == store.alias("m", "production")
    for a, b in itertools.pairwise(history):
        assert b.from_version == a.to_version
    # a loser through the CLI gets the race exit code
    rec, etag = store.alias_record("m", "production")
    assert rec is not None and etag is not None


@pytest.mark.slow
def test_sigkill_during_push(mreg: Any, tmp_path: Path, remote_url: str, s3env: dict[str, str],
                            cache_root: Path, store_root: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    rnd = random.Random(5)
    for i in range(6):
        write_random_safetensors(src / f"model-{i}.safetensors", 6 << 20, rnd.randrange(1 << 30))
    write_random_safetensors(src / "large.safetensors", 70 << 20, rnd.randrange(1 << 30))  # multipart
    (src / "config.json").write_text("{}")
    assert mreg("convert", src, "--to", "hf", "--name", "big").exit_code == 0
    env = {**os.environ, **s3env}
    cmd = [str(Path(sys.executable).parent / "mreg"), "push", "big@1", remote_url, "--json"]
    t0 = time.monotonic()
    subprocess.run([*cmd[:-2], f"{remote_url}-probe", "--json"], env=env, check=True, capture_output=True)
    full = time.monotonic() - t0
    total = sum(p.stat().st_size for p in src.iterdir())
    from registry.store.verify import verify_remote

    killed = run = 0
    while killed < 10 and run < 25:
        run += 1
        url = f"{remote_url}-{run}"
        store = S3Store(url)
        p = subprocess.Popen([*cmd[:-2], url, "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rnd.uniform(0.1, 0.9 * full))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.communicate()
        for n in store.versions("big"):
            report = verify_remote(store, store.version("big", n))
            assert report.ok, f"a visible remote version is incomplete: {report.problems}"
        present = sum(1 for o in store.list_objects(store.key("blobs") + "/"))
        done = subprocess.run([*cmd[:-2], url, "--json"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        # A request the server had fully received may still land after the kill: hence >=.
        assert doc["reused"] or doc["present_blobs"] >= present, "the re-push found what the killed one left"
        assert doc["reused"] or doc["uploaded_blobs"] + doc["present_blobs"] == 8
        assert doc["reused"] or doc["uploaded_bytes"] < total or present == 0
        assert store.versions("big") == [1]
        assert verify_remote(store, store.version("big", 1)).ok
    assert killed >= 10, f"only {killed} of {run} pushes were killed mid-way (a full push takes {full:.2f}s)"


@pytest.mark.slow
def test_sync_follows_the_alias_under_a_promotion_storm(mreg: Any, model_dir: Path, remote_url: str,
                                                       s3env: dict[str, str], tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url)
    node = tmp_path / "node"
    env = {**os.environ, **s3env}
    watcher = subprocess.Popen([str(Path(sys.executable).parent / "mreg"), "sync", remote_url, "m", "--store",
                                str(node), "--watch", "0.05", "--json"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    mount = node / "models" / "m" / "production"
    deadline = time.monotonic() + 30
    while not mount.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    bad: list[str] = []
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            reads += 1
            try:
                doc = json.loads((mount / "manifest.json").read_bytes())
                for f in doc["artifacts"][0]["files"]:
                    if (mount / "hf" / f["path"]).stat().st_size != f["size"]:
                        bad.append(f"size {f['path']}")
            except Exception as e:  # noqa: BLE001 - any failed read is a finding
                bad.append(repr(e))

    t = threading.Thread(target=reader)
    t.start()
    store = S3Store(remote_url)
    from registry.release import aliases

    rnd = random.Random(3)
    for _ in range(25):
        aliases.promote(store, "m", store.version("m", rnd.choice([1, 2, 3])))
        time.sleep(0.03)
    final = store.alias("m", "production")
    deadline = time.monotonic() + 30
    while LocalStore(node).alias("m", "production") != final and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join()
    watcher.send_signal(signal.SIGTERM)
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert bad == [], bad[:5]
    assert reads > 50
    assert LocalStore(node).alias("m", "production") == final
    changes = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert changes and changes[-1]["version"] == final
    from registry.store.verify import verify_version

    local = LocalStore(node)
    assert all(verify_version(local, local.version("m", n)).ok for n in local.versions("m"))


@pytest.mark.slow
def test_corrupt_remote_blob_is_never_published_locally(mreg: Any, model_dir: Path, remote_url: str,
                                                        s3server: SeaweedS3, tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    store = S3Store(remote_url)
    weights = next(f for f in store.version("m", 1).manifest.artifacts[0].files if f.path == "model.safetensors")
    s3server.client().put_object(Bucket=BUCKET, Key=store.blob_key(weights.sha256), Body=b"\0" * weights.size)
    node = tmp_path / "node"
    r = mreg("sync", remote_url, "m", "--store", node, "--json")
    assert r.exit_code == 4 and "is corrupt" in r.json["error"]["message"]
    assert LocalStore(node).versions("m") == [] and LocalStore(node).alias("m", "production") is None
    assert not [p for p in (node / "tmp").iterdir() if p.is_dir()], "the staging tree was discarded"
    v = mreg("verify", "m@1", "--store", remote_url, "--json")
    assert v.exit_code == 4 and "corrupt" in v.json["versions"][0]["problems"][0]


def _rewrite(s3server: SeaweedS3, key: str, **changes: Any) -> bytes:
    """Change fields of a JSON object behind mreg's back (what anyone who can write the bucket can do)."""
    client = s3server.client()
    doc = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data = json.dumps({**doc, **changes}).encode()
    client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return data


@contextlib.contextmanager
def _restored(s3server: SeaweedS3, *keys: str) -> Iterator[None]:
    """Put these objects back as they were afterwards: one pushed version serves every tampering."""
    client = s3server.client()
    saved = {k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}
    try:
        yield
    finally:
        for k, data in saved.items():
            client.put_object(Bucket=BUCKET, Key=k, Body=data)


@pytest.mark.slow
def test_a_manifest_that_disagrees_with_its_key_is_refused_before_anything_local(
        mreg: Any, model_dir: Path, remote_url: str, s3server: SeaweedS3, tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    store = S3Store(remote_url)
    key, alias_key = store.manifest_key("m", 1), store.alias_key("m", "production")
    node = tmp_path / "node"
    for change in ({"version": 2}, {"name": "other"}):
        with _restored(s3server, key, alias_key):
            data = _rewrite(s3server, key, **change)
            # The alias record is made to match the new bytes: only the key can give the manifest away.
            _rewrite(s3server, alias_key, manifest_sha256=hashlib.sha256(data).hexdigest())
            refused(mreg("sync", remote_url, "m", "--store", node, "--json"), key)
            assert files(node) == {}, f"{change}: nothing may be written locally"
            refused(mreg("show", "m@production", "--store", remote_url, "--json"), key)
            r = mreg("verify", "m@1", "--store", remote_url, "--json")
            refused(r, "m@1")
            assert key in r.json["versions"][0]["problems"][0]


@pytest.mark.slow
def test_an_alias_record_that_disagrees_with_its_key_or_names_no_version_is_refused(
        mreg: Any, model_dir: Path, remote_url: str, s3server: SeaweedS3, tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    key = S3Store(remote_url).alias_key("m", "production")
    node = tmp_path / "node"
    for change in ({"version": 7}, {"name": "other"}, {"alias": "staging"}):
        with _restored(s3server, key):
            _rewrite(s3server, key, **change)
            refused(mreg("sync", remote_url, "m", "--store", node, "--json"), key)
            assert files(node) == {}, f"{change}: nothing may be written locally"
            refused(mreg("show", "m@production", "--store", remote_url, "--json"), key)
            refused(mreg("list", "m", "--store", remote_url, "--json"), key)


def test_a_download_cut_mid_body_exits_9_and_publishes_nothing(
        mreg: Any, model_dir: Path, remote_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server sends the headers, then the connection drops in the middle of a blob's body (mreg reads a body
    one network read at a time, urllib3's `read1`: the first read of a blob is the last)."""
    from urllib3.exceptions import ProtocolError
    from urllib3.response import HTTPResponse

    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    real = HTTPResponse.read1

    def cut(self: HTTPResponse, amt: int | None = None) -> bytes:
        chunk = real(self, amt)
        if chunk and "/blobs/" in (self.url or ""):
            raise ProtocolError("Connection broken: connection reset by peer")
        return chunk

    monkeypatch.setattr(HTTPResponse, "read1", cut)
    node = tmp_path / "node"
    r = mreg("sync", remote_url, "m", "--store", node, "--json")
    assert r.exit_code == 9 and "downloading blob" in r.json["error"]["message"], r.stdout
    assert "\n" not in r.json["error"]["message"] and r.json["error"]["hint"]
    assert LocalStore(node).versions("m") == [] and LocalStore(node).alias("m", "production") is None
    assert not [p for p in (node / "tmp").iterdir() if p.is_dir()], "the staging tree was discarded"
    monkeypatch.setattr(HTTPResponse, "read1", real)
    assert mreg("sync", remote_url, "m", "--store", node).exit_code == 0, "the next sync completes"


@pytest.mark.slow
def test_remote_gc_sweeps_only_old_unreferenced_blobs(mreg: Any, model_dir: Path, remote_url: str,
                                                      s3server: SeaweedS3) -> None:
    _versions(mreg, model_dir, "m", 1)
    mreg("push", "m@1", remote_url)
    store = S3Store(remote_url)
    orphan = "f" * 64
    store.put(store.blob_key(orphan), b"orphan")
    leased = "e" * 64
    store.put(store.blob_key(leased), b"leased")
    lease = store.take_lease([leased])
    abandoned = store.blob_key("d" * 64)  # a push killed mid-upload leaves its parts behind
    s3server.client().create_multipart_upload(Bucket=BUCKET, Key=abandoned)
    uploads = store.key("blobs") + "/"
    plan = mreg("gc", "--store", remote_url, "--grace-hours", "0", "--json").json
    assert plan["applied"] is False and plan["blobs"] == 1
    assert store.exists(store.blob_key(orphan))
    assert [u["Key"] for u in store.multipart_uploads(uploads)] == [abandoned]
    assert mreg("gc", "--store", remote_url, "--grace-hours", "0", "--yes").exit_code == 0
    assert not store.exists(store.blob_key(orphan))
    assert list(store.multipart_uploads(uploads)) == []
    store.abort_upload(abandoned, "no-such-upload")  # already gone is fine
    assert store.exists(store.blob_key(leased)), "a live lease protects an in-flight push's blobs"
    store.delete(lease)
    assert mreg("gc", "--store", remote_url, "--yes", "--json").json["blobs"] == 0, "grace protects young blobs"
    assert mreg("verify", "--all", "--store", remote_url).exit_code == 0


@pytest.mark.slow
def test_sync_is_idempotent_and_local_only_commands_refuse_s3(mreg: Any, model_dir: Path, remote_url: str,
                                                             tmp_path: Path) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    node = LocalStore(tmp_path / "node")
    first = sync(S3Source(S3Store(remote_url), "m", "production"), node, "production")
    again = sync(S3Source(S3Store(remote_url), "m", "production"), node, "production")
    assert first.changed and first.downloaded_blobs == 2 and not again.changed and again.downloaded_bytes == 0
    assert (node.root / "models/m/production/hf/config.json").read_text() == '{"i": 0}'
    r = mreg("mount-check", "m", "--store", remote_url)
    assert r.exit_code == 2 and "mreg push" in r.stderr
    again_here = mreg("convert", model_dir, "--to", "hf", "--name", "m", "--store", remote_url, "--json")
    assert again_here.exit_code == 0 and again_here.json["reused"] and again_here.json["version"] == 1, \
        "a conversion into the S3 store finds the pushed version by its key"
    local = LocalStore(Path(os.environ["MREG_STORE"]))
    assert push(S3Sink(S3Store(remote_url)), local, local.version("m", 1)).reused


@pytest.mark.slow
def test_a_lost_race_through_the_cli_exits_5(mreg: Any, model_dir: Path, remote_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _pushed_first_promoted(mreg, model_dir, remote_url)
    real = S3Store.alias_record
    raced = []

    def read_then_someone_else_writes(self: S3Store, name: str, alias: str) -> Any:
        got = real(self, name, alias)
        if not raced:  # another CI job flips the alias between our read and our write
            raced.append(True)
            from registry.release import aliases

            other = S3Store(remote_url)
            aliases.promote(other, "m", other.version("m", 2))
        return got

    monkeypatch.setattr(S3Store, "alias_record", read_then_someone_else_writes)
    r = mreg("promote", "m@3", "--store", remote_url, "--json")
    assert r.exit_code == 5 and "lost a race" in r.json["error"]["message"]
    monkeypatch.setattr(S3Store, "alias_record", real)
    assert S3Store(remote_url).alias("m", "production") == 2, "the other writer's update is not lost"
    assert [e.to_version for e in S3Store(remote_url).history("m")] == [1, 2]


@pytest.mark.slow
def test_secrets_are_never_printed_or_stored(mreg: Any, model_dir: Path, remote_url: str, s3env: dict[str, str],
                                             store_root: Path, tmp_path: Path) -> None:
    _versions(mreg, model_dir, "m", 1)
    outputs = [mreg("push", "m@1", remote_url, "--json"), mreg("promote", "m@1", "--store", remote_url),
               mreg("sync", remote_url, "m", "--store", tmp_path / "node"),
               mreg("show", "m@1", "--store", remote_url, "--json"), mreg("config", "--json")]
    secret = s3env["AWS_SECRET_ACCESS_KEY"]
    for r in outputs:
        assert r.exit_code == 0
        assert secret not in r.stdout + r.stderr and s3env["AWS_ACCESS_KEY_ID"] not in r.stdout + r.stderr
    for root in (store_root, tmp_path / "node"):
        for p in root.rglob("*"):
            if p.is_file() and p.stat().st_size < 1 << 20:
                assert secret.encode() not in p.read_bytes(), p


def test_repush_after_a_crash_between_manifest_and_index(mreg: Any, model_dir: Path, remote_url: str) -> None:
    _versions(mreg, model_dir, "m", 1)
    first = mreg("push", "m@1", remote_url, "--json").json
    store = S3Store(remote_url)
    key = store.version("m", 1).manifest.key
    store.delete(store.key("models", "m", "keys", f"{key}.json"))
    again = mreg("push", "m@1", remote_url, "--json").json
    assert again["reused"] is True and again["remote_version"] == first["remote_version"] == 1
    assert store.versions("m") == [1] and store.exists(store.key("models", "m", "keys", f"{key}.json"))


@pytest.mark.slow
def test_push_of_a_damaged_local_blob_is_refused_by_the_server(mreg: Any, model_dir: Path, remote_url: str,
                                                              store_root: Path) -> None:
    _versions(mreg, model_dir, "m", 1)
    weights = store_root / "models/m/versions/1/hf/model.safetensors"
    os.chmod(weights, 0o644)
    with open(weights, "r+b") as f:
        f.write(b"damaged")
    r = mreg("push", "m@1", remote_url, "--json")
    assert r.exit_code == 4 and "different SHA-256" in r.json["error"]["message"]
    assert S3Store(remote_url).versions("m") == [], "nothing was published remotely"


def test_watch_reports_an_unreachable_store_and_keeps_following(
        model_dir: Path, remote_url: str, mreg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that stops answering for a round is reported; the next round syncs (the watcher does not end)."""
    import threading

    from registry.errors import StoreUnreachable
    from registry.store import transfer as remote

    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    real, rounds, errors, changes = remote.sync, [], [], []
    stop = threading.Event()

    def flaky(*args: Any, **kwargs: Any) -> Any:
        rounds.append(1)
        if len(rounds) == 1:
            raise StoreUnreachable("listing s3://bucket failed: connection refused")
        stop.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(remote, "sync", flaky)
    remote.watch(S3Source(S3Store(remote_url), "m", "production"), LocalStore(tmp_path / "node"), "production",
                 0.01, changes.append, stop, errors.append)
    assert [type(e).__name__ for e in errors] == ["StoreUnreachable"] and len(rounds) == 2
    assert [c.version for c in changes] == [1]


@pytest.mark.slow
def test_a_gc_lock_left_by_a_killed_gc_expires_and_a_live_one_names_its_owner(mreg: Any, model_dir: Path,
                                                                              remote_url: str) -> None:
    """A gc killed mid-way left gc.lock, which blocked every later gc forever."""
    _versions(mreg, model_dir, "m", 1)
    assert mreg("push", "m@1", remote_url).exit_code == 0
    store = S3Store(remote_url)
    lock = store.key("gc.lock")
    store.put(lock, json.dumps({"at": time.time(), "owner": "ci-7:4242"}).encode())
    r = mreg("gc", "--store", remote_url, "--yes", "--json")
    assert r.exit_code == 5 and "ci-7:4242" in r.json["error"]["message"] and "gc.lock" in r.json["error"]["hint"]
    store.put(lock, json.dumps({"at": time.time() - 2 * 3600, "owner": "ci-7:4242"}).encode())
    assert mreg("gc", "--store", remote_url, "--yes").exit_code == 0, "an expired lock is a dead gc's"
    assert not store.exists(lock), "and the new gc released its own"
    store.put(lock, b"\x00 not json")
    assert mreg("gc", "--store", remote_url, "--yes").exit_code == 0, "a lock mreg did not write is not a live gc"
    assert mreg("push", "m@1", remote_url).exit_code == 0


@pytest.mark.slow
def test_a_damaged_local_blob_is_not_pushed_and_a_damaged_remote_one_is_repaired(
        mreg: Any, tmp_path: Path, remote_url: str, store_root: Path) -> None:
    """Multipart uploads carry no whole-object check: the blob is hashed before it travels. A remote blob
    cut short is sent again by the next push, even of a version already there."""
    src = tmp_path / "big"
    src.mkdir()
    write_random_safetensors(src / "large.safetensors", 70 << 20, 3)  # past the multipart threshold
    (src / "config.json").write_text("{}")
    assert mreg("convert", src, "--to", "hf", "--name", "big").exit_code == 0
    store = LocalStore(store_root)
    (entry,) = [f for f in store.version("big", 1).manifest.artifacts[0].files if f.path == "large.safetensors"]
    blob = layout.blob_path(store_root, entry.sha256)
    good = blob.read_bytes()
    os.chmod(blob, 0o644)
    blob.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit, same size
    r = mreg("push", "big@1", remote_url, "--json")
    assert r.exit_code == 4 and "does not match its name" in r.json["error"]["message"], r.stderr
    remote = S3Store(remote_url)
    assert remote.versions("big") == [], "nothing published"
    blob.write_bytes(good)
    assert mreg("push", "big@1", remote_url).exit_code == 0
    remote.put(remote.blob_key(entry.sha256), b"cut short", sha256=None)
    again = mreg("push", "big@1", remote_url, "--json")
    assert again.exit_code == 0 and again.json["reused"] and again.json["uploaded_blobs"] == 1
    assert mreg("verify", "big@1", "--store", remote_url).exit_code == 0


@pytest.mark.slow
def test_push_verify_remote_repairs_a_same_size_tampered_blob(mreg: Any, model_dir: Path, remote_url: str,
                                                              s3server: SeaweedS3) -> None:
    """A remote blob replaced by other bytes of the same size passes the size check of a plain push; with
    --verify-remote every remote blob is read through the digest, and the one that fails is uploaded again."""
    _versions(mreg, model_dir, "m", 1)
    assert mreg("push", "m@1", remote_url).exit_code == 0
    store = S3Store(remote_url)
    weights = next(f for f in store.version("m", 1).manifest.artifacts[0].files if f.path == "model.safetensors")
    key = store.blob_key(weights.sha256)
    s3server.client().put_object(Bucket=BUCKET, Key=key, Body=b"\0" * weights.size)  # same size, other bytes
    plain = mreg("push", "m@1", remote_url, "--json").json
    assert (plain["uploaded_blobs"], plain["repaired_blobs"], plain["verified_remote"]) == (0, 0, False)
    assert mreg("verify", "m@1", "--store", remote_url).exit_code == 4, "still damaged: a size check cannot tell"
    r = mreg("push", "m@1", remote_url, "--verify-remote")
    assert r.exit_code == 0 and "1 damaged remote blob(s) repaired" in r.stdout, r.stderr + r.stdout
    assert hashlib.sha256(s3server.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()).hexdigest() \
        == weights.sha256
    assert mreg("verify", "m@1", "--store", remote_url).exit_code == 0
    again = mreg("push", "m@1", remote_url, "--verify-remote", "--json").json
    assert (again["uploaded_blobs"], again["repaired_blobs"], again["verified_remote"]) == (0, 0, True)
    assert again["reused"] is True and again["present_blobs"] == len(store.version("m", 1).manifest.artifacts[0].files)


def test_a_reload_hook_on_s3_is_told_the_alias_url(mreg: Any, model_dir: Path, remote_url: str,
                                                   tmp_path: Path) -> None:
    """MREG_PATH names the alias's record in the bucket, an s3:// URL (not a Path() of it: `s3:/bucket/…`)."""
    _versions(mreg, model_dir, "m", 1)
    assert mreg("push", "m@1", remote_url).exit_code == 0
    log = tmp_path / "reloads"
    r = mreg("promote", "m@1", "--store", remote_url, "--reload", f'echo "$MREG_STORE $MREG_PATH" > {log}')
    assert r.exit_code == 0, r.stderr
    assert log.read_text().split() == [remote_url, f"{remote_url}/models/m/aliases/production.json"]


@pytest.mark.slow
def test_watch_puts_back_the_signal_handlers_it_replaced(mreg: Any, model_dir: Path, remote_url: str,
                                                         tmp_path: Path) -> None:
    """`sync --watch` in-process (a test runner, a pipeline): once SIGTERM stops it, SIGINT and SIGTERM go where
    they went before."""
    _pushed_first_promoted(mreg, model_dir, remote_url, n=1)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    original = signal.signal(signal.SIGTERM, lambda *_: None)  # a handler of the caller's own, not the default
    before[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)

    def stop_once_installed() -> None:
        deadline = time.monotonic() + 30
        while signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM] and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=stop_once_installed)
    killer.start()
    try:
        r = mreg("sync", remote_url, "m", "--store", tmp_path / "node", "--watch", "0.05", "--json")
        killer.join()
        assert r.exit_code == 0, r.stderr
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(signal.SIGTERM, original)


@pytest.mark.slow
def test_push_and_sync_take_one_shape_for_every_remote(mreg: Any, model_dir: Path, remote_url: str,
                                                       store_root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`api.push(store, version, remote)` and `api.sync(store, remote, name)` with the remote as a string, parsed
    by `api.open_remote`; an option of the other kind of remote is refused before anything moves. Both pushes go
    through the one push core, each with its sink."""
    from registry import api
    from registry.errors import UsageError
    from registry.store import transfer

    sinks: list[str] = []
    core = transfer.push

    def spy(sink: Any, *args: Any, **kwargs: Any) -> transfer.PushOutcome:
        sinks.append(type(sink).__name__)
        return core(sink, *args, **kwargs)

    monkeypatch.setattr(transfer, "push", spy)
    _versions(mreg, model_dir, "m", 1)
    local = api.open_local_store(store_root)
    for bad in ({"as_image": True}, {"force": True}, {"base": "oci-layout:/x"}, {"chunk": 1 << 20}):
        with pytest.raises(UsageError, match="for OCI destinations"):
            api.push(local, "m@1", remote_url, **bad)
    assert S3Store(remote_url).versions("m") == [], "nothing was pushed"
    with pytest.raises(UsageError, match="for S3 stores"):
        api.push(local, "m@1", f"oci-layout:{tmp_path / 'layout'}:1", verify_remote=True)
    with pytest.raises(UsageError, match="not a remote"):
        api.open_remote("ftp://host/models")
    pushed = api.push(local, "m@1", remote_url)
    assert (pushed.version.number, pushed.uploaded_blobs, pushed.tag) == (1, 2, None)
    assert pushed.digest == pushed.version.manifest_sha256
    api.promote(S3Store(remote_url), "m@1")
    node = api.open_local_store(tmp_path / "node")
    with pytest.raises(UsageError, match="NAME is required"):
        api.sync(node, remote_url)
    synced = api.sync(node, remote_url, "m")
    assert (synced.name, synced.version, synced.changed, synced.digest) == ("m", 1, True, pushed.digest)
    laid = api.push(local, "m@1", f"oci-layout:{tmp_path / 'layout'}:v1")
    assert laid.tag == "v1" and laid.digest.startswith("sha256:") and laid.uploaded_blobs > 0
    other = api.open_local_store(tmp_path / "other")
    from_layout = api.sync(other, f"oci-layout:{tmp_path / 'layout'}:v1", alias="stable")
    assert (from_layout.name, from_layout.version, from_layout.digest) == ("m", 1, laid.digest)
    assert other.alias("m", "stable") == 1
    assert sinks == ["S3Sink", "OciSink"]
