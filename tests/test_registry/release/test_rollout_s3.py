"""Staged rollouts on an S3 store (SeaweedFS on loopback): the rollout record is part of the alias record, so a
step, the alias's target and the history entry commit in one conditional PUT; two starts race, one wins."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.s3_server import SeaweedS3, running

from registry import api
from registry.errors import Conflict
from registry.release import rollout

BUCKET = "mreg-rollout"


@pytest.fixture(scope="module")
def s3server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server for the module; each test uses its own prefix."""
    with running(tmp_path_factory.mktemp("seaweed"), BUCKET) as server:
        yield server


@pytest.fixture
def remote(s3server: SeaweedS3, monkeypatch: pytest.MonkeyPatch, mreg: Any, model_dir: Path,
           request: pytest.FixtureRequest) -> str:
    """m@1..3 pushed to a fresh prefix, production -> 1 there."""
    for k, v in s3server.env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{BUCKET}/{request.node.name.replace('[', '-').replace(']', '')}-{random.randrange(1 << 30)}"
    for i in range(3):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
        assert mreg("push", f"m@{i + 1}", url).exit_code == 0
    ok(mreg("promote", "m@1", "--store", url, "--json"))
    return url


@pytest.mark.slow
def test_s3_rollout_to_done_and_abort(mreg: Any, remote: str, s3server: SeaweedS3, tmp_path: Path) -> None:
    st = ["--store", remote]
    log = tmp_path / "weights"
    ok(mreg("rollout", "start", "m@2", "--steps", "20,100", "--apply", f'echo "$MREG_CANARY_WEIGHT" >> {log}',
            *st, "--json"))
    assert ok(mreg("resolve", "m@production-canary", *st, "--json"))["version"] == 2
    assert ok(mreg("resolve", "m@production", *st, "--json"))["version"] == 1
    r = mreg("promote", "m@3", *st, "--json")
    assert r.exit_code == 5 and "under a staged rollout" in r.json["error"]["message"]
    node = tmp_path / "node"  # a serving node's store, synced from the bucket: it holds both versions meanwhile
    ok(mreg("sync", remote, "m", "--store", str(node), "--json"))
    assert os.readlink(node / "models/m/production") == "versions/1"
    assert os.readlink(node / "models/m/production-canary") == "versions/2"
    done = ok(mreg("rollout", "run", "m", *st, "--json"))
    assert done["rollout"]["state"] == "done"
    assert ok(mreg("resolve", "m@production", *st, "--json"))["version"] == 2
    assert mreg("resolve", "m@production-canary", *st, "--json").exit_code == 3
    assert log.read_text().split() == ["0", "20", "100"]
    ok(mreg("sync", remote, "m", "--store", str(node), "--json"))
    assert os.readlink(node / "models/m/production") == "versions/2"
    assert not os.path.lexists(node / "models/m/production-canary"), "the canary alias goes once the rollout is over"
    hist = ok(mreg("history", "m", "--alias", "production", *st, "--json"))["entries"]
    assert [e["action"] for e in hist] == ["promote", "rollout-start", "rollout-step", "rollout-done"]
    assert hist[-1]["from"] == 1 and hist[-1]["to"] == 2 and hist[-1]["rollout"]["weight"] == 100
    # a second rollout, aborted; a promote after it keeps the ended record with the alias
    ok(mreg("rollout", "start", "m@3", "--steps", "50,100", *st, "--json"))
    ok(mreg("rollout", "advance", "m", *st, "--json"))
    aborted = ok(mreg("rollout", "abort", "m", "-m", "bad answers", *st, "--json"))["rollout"]
    assert (aborted["state"], aborted["weight"]) == ("aborted", 0)
    assert ok(mreg("resolve", "m@production", *st, "--json"))["version"] == 2
    config = tmp_path / "mreg.toml"  # an events URL that takes nothing: the event is kept in the bucket
    config.write_text('[events]\nurls = ["http://127.0.0.1:9/events"]\ntries = 1\n')
    r = mreg("rollback", "m", *st, "--config", str(config), "--json")
    assert r.exit_code == 0 and r.json["to"] == 1
    assert f"kept in s3://{BUCKET}/" in r.stderr and "/events/undelivered/" in r.stderr, r.stderr
    assert ok(mreg("rollout", "status", "m", *st, "--json"))["rollout"]["state"] == "aborted"


@pytest.mark.slow
def test_s3_killed_run_resumes_from_the_recorded_step(mreg: Any, remote: str, tmp_path: Path) -> None:
    """`rollout run` SIGKILLed between steps: the record in the bucket says where it was; a new run goes on."""
    st = ["--store", remote]
    log = tmp_path / "weights"
    # The interval is the window in which this test must see step 20 and kill the run before it takes the next
    # one: 4 s, so that a loaded machine's slow status reads (an S3 round trip each) still fit in it.
    ok(mreg("rollout", "start", "m@2", "--steps", "10,20,100", "--interval", "4s", "--apply",
            f'echo "$MREG_CANARY_WEIGHT" >> {log}', *st, "--json"))
    ok(mreg("rollout", "advance", "m", *st, "--json"))
    proc = subprocess.Popen([sys.executable, "-c", "from registry.cli import run; run()", "rollout", "run", "m", *st,
                             "--json"], env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while ok(mreg("rollout", "status", "m", *st, "--json"))["rollout"]["weight"] != 20:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    assert ok(mreg("rollout", "status", "m", *st, "--json"))["rollout"]["state"] == "running"
    assert ok(mreg("resolve", "m@production", *st, "--json"))["version"] == 1, "the stable path never moved"
    done = ok(mreg("rollout", "run", "m", *st, "--json"))
    assert done["rollout"]["state"] == "done" and [s["weight"] for s in done["steps_taken"]] == [100]
    assert ok(mreg("resolve", "m@production", *st, "--json"))["version"] == 2
    weights = log.read_text().split()
    assert weights[:3] == ["0", "10", "20"] and weights[-1] == "100" and set(weights) <= {"0", "10", "20", "100"}
    hist = ok(mreg("history", "m", "--alias", "production", *st, "--json"))["entries"]
    assert [e["action"] for e in hist].count("rollout-done") == 1


@pytest.mark.slow
def test_s3_two_starts_race_one_wins(mreg: Any, remote: str) -> None:
    store = api.open_store(remote)
    barrier = threading.Barrier(2)
    results: dict[int, object] = {}
    real = store.transact_rollout

    def slow(name: str, alias: str, decide: Any) -> Any:
        def held(*a: Any) -> Any:
            out = decide(*a)
            barrier.wait(timeout=30)  # both have read the same record before either writes
            return out
        return real(name, alias, held)

    store.transact_rollout = slow  # type: ignore[method-assign]

    def go(v: int) -> None:
        try:
            results[v] = rollout.start(store, "m", store.version("m", v), rollout.plan("5,100"))
        except Conflict as e:
            results[v] = e

    threads = [threading.Thread(target=go, args=(v,)) for v in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    lost = [v for v, r in results.items() if isinstance(r, Conflict)]
    won = [v for v, r in results.items() if isinstance(r, rollout.Outcome)]
    assert len(lost) == 1 and len(won) == 1, results
    assert "lost a race" in str(results[lost[0]])
    rec = api.open_store(remote).rollout("m", "production")
    assert rec is not None and rec.canary == won[0]
    r = mreg("rollout", "start", f"m@{lost[0]}", "--steps", "5,100", "--store", remote, "--json")
    assert r.exit_code == 5 and "already under a rollout" in r.json["error"]["message"]
