"""One conversion key, one run doing the work: racing `mreg convert` processes on one local store and on one S3 store
(SeaweedFS), a holder killed (SIGKILL) or hung (SIGSTOP) mid-conversion, --no-wait, and gc of expired leases."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.s3_server import SeaweedS3, running

from registry import layout
from registry.store.lease import FileSlot, new_doc
from registry.store.s3 import S3Store

BUCKET = "mreg-lease"
TESTS = Path(__file__).resolve().parents[2]
#: Short leases, so that a hung holder is taken over in seconds.
LEASE_S = "2"


@pytest.fixture(scope="module")
def s3server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server for the module; each test uses its own prefix."""
    with running(tmp_path_factory.mktemp("seaweed"), BUCKET) as server:
        yield server


@pytest.fixture
def remote_url(s3server: SeaweedS3, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A fresh prefix in the test bucket, with credentials and endpoint in the environment."""
    for k, v in s3server.env.items():
        monkeypatch.setenv(k, v)
    return f"s3://{BUCKET}/{request.node.name.replace('[', '-').replace(']', '')}-{random.randrange(1 << 30)}"


class Runner:
    """`mreg convert` runs as processes of their own (tests/support/workers.py convert_cli), counted by markers."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.markers = tmp / "markers"
        self.markers.mkdir()
        self.n = 0
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
                    "MREG_LEASE_SECONDS": LEASE_S}

    def start(self, *argv: str | Path, delay: float = 0.0) -> tuple[subprocess.Popen[bytes], Path]:
        """Start one run; its result file."""
        self.n += 1
        out = self.tmp / f"run{self.n}.json"
        cmd = [sys.executable, str(TESTS / "support" / "workers.py"), "convert_cli", str(out), str(self.markers),
               str(delay), *map(str, argv)]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out

    def conversions(self) -> int:
        """How many runs started converting."""
        return len(list(self.markers.iterdir()))

    def wait_for_marker(self, timeout: float = 60) -> None:
        """Until one run converts."""
        deadline = time.monotonic() + timeout
        while not self.conversions():
            assert time.monotonic() < deadline, "no run started converting"
            time.sleep(0.05)


def _result(p: subprocess.Popen[bytes], out: Path, timeout: float = 90) -> dict[str, Any]:
    p.wait(timeout)
    assert out.exists(), (p.stderr.read() if p.stderr else b"").decode()[-2000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _store_args(kind: str, store_root: Path, remote: str) -> list[str]:
    return ["--store", remote] if kind == "s3" else ["--store", str(store_root)]


def _leases(kind: str, store_root: Path, remote: str) -> list[str]:
    """Every conversion lease left in the store."""
    if kind == "local":
        return [p.name for p in (store_root / layout.LOCKS).glob("*" + layout.LEASE_SUFFIX)]
    s3 = S3Store(remote)
    return [o["Key"] for o in s3.list_objects(s3.key(*layout.s3_conversion_leases()) + "/")]


def _verified(kind: str, store_root: Path, remote: str) -> list[int]:
    """The versions of m, once `mreg verify --all` passes on the store."""
    args = _store_args(kind, store_root, remote)
    r = run("verify", "--all", *args, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    listed = run("list", "m", *args, "--json")
    assert listed.exit_code == 0, listed.stderr
    return sorted(v["version"] for v in listed.json["versions"])


@pytest.fixture(params=["local", "s3"])
def kind(request: pytest.FixtureRequest) -> str:
    """The store the runs share."""
    return str(request.param)


@pytest.fixture
def remote(kind: str, request: pytest.FixtureRequest) -> str:
    """The S3 store's URL (for the s3 kind)."""
    return str(request.getfixturevalue("remote_url")) if kind == "s3" else ""


@pytest.mark.slow
def test_eight_runs_of_one_key_convert_once(kind: str, remote: str, model_dir: Path, store_root: Path,
                                            tmp_path: Path) -> None:
    """8 processes, one key, one store: one converts, the 7 others wait for its version and print it."""
    runner = Runner(tmp_path)
    argv = ["convert", model_dir, "--to", "hf", "--name", "m", "--json", *_store_args(kind, store_root, remote)]
    runs = [runner.start(*argv, delay=0.5) for _ in range(8)]
    docs = [_result(p, out) for p, out in runs]
    assert [d["exit_code"] for d in docs] == [0] * 8, [d["stderr"][-500:] for d in docs if d["exit_code"]]
    outs = [json.loads(d["stdout"]) for d in docs]
    assert runner.conversions() == 1, "exactly one run converted"
    assert sorted(o["reused"] for o in outs) == [False] + [True] * 7
    assert {(o["version"], o["manifest_sha256"]) for o in outs} == {(1, outs[0]["manifest_sha256"])}
    assert any("waiting:" in d["stderr"] and "is being done by" in d["stderr"] for d in docs), \
        "a waiter says whom it waits for"
    assert _verified(kind, store_root, remote) == [1]
    assert _leases(kind, store_root, remote) == [], "the holder released its lease"


def _holder_pid(kind: str, store_root: Path, remote: str) -> int:
    """The pid the lease names (waiting until it exists)."""
    deadline = time.monotonic() + 30
    while True:
        keys = _leases(kind, store_root, remote)
        if keys:
            if kind == "local":
                data = (store_root / layout.LOCKS / keys[0]).read_bytes()
            else:
                obj = S3Store(remote).get(keys[0])
                assert obj is not None
                data = obj.data
            return int(json.loads(data)["pid"])
        assert time.monotonic() < deadline, "no lease appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_holder_killed_mid_conversion_is_taken_over(kind: str, remote: str, model_dir: Path, store_root: Path,
                                                    tmp_path: Path) -> None:
    """SIGKILL the run holding the lease while it converts: a waiter takes over within the lease's duration and
    publishes the one version; nothing partial, no lease left. Meanwhile --no-wait exits 5 naming the holder."""
    runner = Runner(tmp_path)
    argv = ["convert", model_dir, "--to", "hf", "--name", "m", "--json", *_store_args(kind, store_root, remote)]
    holder, _ = runner.start(*argv, delay=60)
    runner.wait_for_marker()
    assert _holder_pid(kind, store_root, remote) == holder.pid
    waiters = [runner.start(*argv) for _ in range(2)]
    nowait = run(*argv, "--no-wait")
    assert nowait.exit_code == 5, nowait.stderr
    error = nowait.json["error"]
    assert f"pid {holder.pid}" in error["message"] and error["details"]["holder"]["pid"] == holder.pid
    time.sleep(0.5)  # the waiters are polling
    holder.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    holder.wait(10)
    docs = [_result(p, out) for p, out in waiters]
    took_over = time.monotonic() - killed
    assert [d["exit_code"] for d in docs] == [0] * 2, [d["stderr"][-500:] for d in docs]
    outs = [json.loads(d["stdout"]) for d in docs]
    assert sorted(o["reused"] for o in outs) == [False, True], "one waiter converted, the other found its version"
    assert runner.conversions() == 2, "the killed holder's conversion and the one that took over"
    assert took_over < float(LEASE_S) + 15, f"taken over and published {took_over:.1f} s after the kill"
    assert _verified(kind, store_root, remote) == [1], "no partial version, one version"
    assert _leases(kind, store_root, remote) == [], "no lease left"
    left = [p for p in Path(tempfile.gettempdir()).glob(".mreg-convert.work-*") if f"-{holder.pid}-" in p.name]
    assert left == [], "the run that took over removed the killed holder's work store"
    print(f"{kind}: SIGKILL → waiters done in {took_over:.2f} s")


@pytest.mark.slow
def test_hung_holder_loses_its_lease_and_publishes_nothing(model_dir: Path, store_root: Path,
                                                           tmp_path: Path) -> None:
    """A holder that stops renewing (SIGSTOP: a stalled machine) is taken over once its lease goes unrenewed for a
    whole duration; woken up, it finds the lease gone and exits 5 without publishing a twin version."""
    runner = Runner(tmp_path)
    argv = ["convert", model_dir, "--to", "hf", "--name", "m", "--json", "--store", str(store_root)]
    holder, holder_out = runner.start(*argv, delay=3)
    runner.wait_for_marker()
    holder.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        waiter, out = runner.start(*argv)
        doc = _result(waiter, out)
        took_over = time.monotonic() - stopped
    finally:
        holder.send_signal(signal.SIGCONT)
    assert doc["exit_code"] == 0 and json.loads(doc["stdout"])["reused"] is False, doc["stderr"][-1000:]
    assert float(LEASE_S) < took_over < float(LEASE_S) + 15
    late = _result(holder, holder_out)
    assert late["exit_code"] == 5, late["stderr"][-1000:]
    assert "lost the lease" in json.loads(late["stdout"])["error"]["message"]
    assert _verified("local", store_root, "") == [1], "the woken holder published nothing"
    assert _leases("local", store_root, "") == []
    print(f"SIGSTOP → taken over and published in {took_over:.2f} s")


def test_one_waiter_of_many_takes_over_an_expired_lease(kind: str, remote: str, store_root: Path) -> None:
    """The conditional replace: 8 threads replace the same expired lease (If-Match / compare under the guard lock):
    exactly one wins."""
    key = "k" * 64
    slot = S3Store(remote).conversion_slot("m", key) if kind == "s3" else FileSlot(store_root, "m", key)
    token = slot.create(new_doc("m", key, 1).model_dump_json().encode())
    assert token is not None
    assert slot.create(b"{}") is None, "create-only"
    barrier = threading.Barrier(8)
    won: list[str | None] = []

    def take() -> None:
        data = new_doc("m", key, 1).model_dump_json().encode()
        barrier.wait()
        won.append(slot.replace(data, token))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [w for w in won if w is not None]
    assert len(won) == 8 and len(winners) == 1
    slot.delete(token)
    assert slot.read() is not None, "a delete with a stale token leaves the new holder's lease"
    slot.delete(winners[0])
    assert slot.read() is None


@pytest.mark.slow
def test_gc_removes_expired_leases_and_keeps_live_ones(kind: str, remote: str, store_root: Path) -> None:
    """A lease long past its expiry (a holder lost for good) goes with gc; a live one stays."""
    stale, live = "a" * 64, "b" * 64
    args = _store_args(kind, store_root, remote)
    store_root.mkdir(parents=True, exist_ok=True)
    for key, expires in ((stale, time.time() - 3600), (live, time.time() + 3600)):
        doc = new_doc("m", key, 60).model_copy(update={"expires": expires, "pid": 1 << 22, "host": "elsewhere"})
        slot = S3Store(remote).conversion_slot("m", key) if kind == "s3" else FileSlot(store_root, "m", key)
        assert slot.create(doc.model_dump_json().encode()) is not None
    planned = run("gc", *args, "--json")
    assert planned.exit_code == 0 and planned.json["stale_leases"] == 1, planned.stdout + planned.stderr
    done = run("gc", "--yes", *args, "--json")
    assert done.exit_code == 0 and done.json["stale_leases"] == 1, done.stdout + done.stderr
    left = _leases(kind, store_root, remote)
    assert len(left) == 1 and live[:32] in left[0] if kind == "local" else left[0].endswith(f"{live}.json")


class _LostAnswers(FileSlot):
    """A local slot whose every write lands but whose first answer to each is lost, the way a store answers when a
    retried request meets its own earlier write (a refusal although the write happened)."""

    def __init__(self, root: Path, name: str, key: str) -> None:
        super().__init__(root, name, key)
        self.refused: list[str] = []

    def create(self, data: bytes) -> str | None:
        token = super().create(data)
        if token is not None and "create" not in self.refused:
            self.refused.append("create")
            return None
        return token

    def replace(self, data: bytes, token: str) -> str | None:
        new = super().replace(data, token)
        if new is not None and "replace" not in self.refused:
            self.refused.append("replace")
            return None
        return new


@pytest.mark.slow
def test_a_lease_whose_write_answers_were_lost_stays_its_holders_and_is_released(store_root: Path) -> None:
    """Ownership is the lease's id in the slot, not the last answer: a create and a renewal that landed although
    the store refused them leave the run holding its lease, renewing it, and removing it when done."""
    from registry.convert.once import run_once

    store_root.mkdir(parents=True, exist_ok=True)
    (store_root / layout.LOCKS).mkdir(parents=True, exist_ok=True)
    slot = _LostAnswers(store_root, "m", "k" * 64)
    renewed: list[bool] = []

    def work(lease: Any) -> str:
        renewed.append(lease.renew())
        lease.confirm()
        return "made"

    started = time.monotonic()
    done = run_once(slot, "m", "k" * 64, find=lambda: None, work=work, duration=30)
    assert time.monotonic() - started < 10, "the run knew its own lease at once (no wait for an expiry)"
    assert done.made == "made" and renewed == [True]
    assert slot.refused == ["create", "replace"]
    assert slot.read() is None, "the holder removed its lease"
