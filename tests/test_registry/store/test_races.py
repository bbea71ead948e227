"""Concurrency and crash safety: many writers, a reader that never sees a gap, SIGKILL at random moments."""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from support import workers
from support.tiny_models import write_safetensors

from registry import layout
from registry.cache import pull_local
from registry.convert.execute import convert
from registry.store.local import LocalStore
from registry.store.verify import verify_version

TESTS = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sixteen_writers_and_a_reader(model_dir: Path, cache_root: Path, store_root: Path, tmp_path: Path) -> None:
    store = LocalStore(store_root)
    for i in range(4):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        convert(store, pull_local(cache_root, model_dir), "m", [("hf", {})])
    from registry.release import aliases

    aliases.promote(store, "m", store.version("m", 1))
    ctx = mp.get_context("spawn")
    stop = tmp_path / "stop"
    rd = ctx.Process(target=workers.reader, args=(str(store_root), "m", str(stop), str(tmp_path / "reader.json")))
    rd.start()
    procs = [
        ctx.Process(target=workers.flipper,
                    args=(str(store_root), "m", [1, 2, 3, 4], 50, seed, str(tmp_path / f"w{seed}.json")))
        for seed in range(16)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    stop.touch()
    rd.join(60)
    result = json.loads((tmp_path / "reader.json").read_text())
    assert result["broken"] == 0, result["errors"]
    assert result["reads"] > 100
    changed = sum(json.loads((tmp_path / f"w{s}.json").read_text())["changed"] for s in range(16))
    history = store.history("m")
    assert len(history) == changed + 1, "exactly one history entry per successful flip"
    assert all(e.action == "promote" for e in history)
    assert history[-1].to_version == store.alias("m", "production")
    for a, b in itertools.pairwise(history):
        assert b.from_version == a.to_version, "every entry starts where the previous one ended"


def _check_store(store: LocalStore, name: str) -> None:
    vdir = layout.versions_dir(store.root, name)
    if vdir.exists():
        for d in vdir.iterdir():
            assert (d / layout.MANIFEST).is_file(), f"partial version visible: {d}"
    for n in store.versions(name):
        report = verify_version(store, store.version(name, n))
        assert report.ok, report.problems
    target = store.alias(name, "production")
    if target is not None:
        assert (layout.alias_path(store.root, name, "production") / layout.MANIFEST).is_file()


@pytest.mark.slow
def test_sigkill_during_publish_never_leaves_a_partial_version(tmp_path: Path, cache_root: Path,
                                                               store_root: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    block = random.Random(1).randbytes(1 << 20)

    def body(f: BinaryIO) -> None:
        for _ in range(48):
            f.write(block)

    write_safetensors(src / "model.safetensors", [("weight", "U8", (48 << 20,), body)])  # what --to hf accepts
    store = LocalStore(store_root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    cmd = [sys.executable, str(TESTS / "support" / "workers.py"), "publish_and_promote", str(cache_root),
           str(store_root),
           str(src), "big"]
    # Measure one full run, and its publish phase, to spread kill moments over both.
    (src / "config.json").write_text('{"run": -1}')
    t0 = time.monotonic()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.split()
    full, publish = time.monotonic() - t0, float(out[-1])
    rnd = random.Random(7)
    killed = runs = mid_publish = 0
    seen_staging: set[str] = set()
    while (killed < 20 or mid_publish < 8) and runs < 80:
        runs += 1
        (src / "config.json").write_text(json.dumps({"run": runs}))
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if runs % 2:
            time.sleep(rnd.uniform(0.05, 0.9 * full))  # anywhere: import, pull into the cache, publish
        else:
            assert p.stdout is not None
            p.stdout.readline()  # "pulled": the store write starts now
            time.sleep(rnd.uniform(0, publish))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.communicate()
        staged = {q.name for q in store.tmp.iterdir()} if store.tmp.exists() else set()
        mid_publish += bool(staged - seen_staging)
        seen_staging |= staged
        _check_store(store, "big")
    assert killed >= 20, f"only {killed} runs were killed mid-way (a full run takes {full:.2f}s)"
    assert mid_publish >= 8, f"only {mid_publish} kills landed while a version was being staged"
    (src / "config.json").write_text('{"run": "final"}')
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    _check_store(store, "big")
    final = int(done.stdout.split()[-2])
    assert store.alias("big", "production") == final
    from registry.store.gc import execute_gc, plan_gc

    execute_gc(store, plan_gc(store, keep_latest=100))
    assert not [p for p in store.tmp.iterdir()], "gc cleared every interrupted staging tree"
    _check_store(store, "big")


@pytest.mark.slow
def test_two_identical_conversions_at_once_publish_one_version(model_dir: Path, cache_root: Path, store_root: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The second run waits for the first and finds its version by the key, instead of publishing a twin."""
    import threading

    from converters.hf.converter import HFConverter
    from registry import api

    real = HFConverter.convert
    both_started = threading.Barrier(2, timeout=30)

    def slow(self: HFConverter, request: Any) -> Any:
        time.sleep(0.5)  # long enough for the other run to reach the same point
        return real(self, request)

    monkeypatch.setattr(HFConverter, "convert", slow)
    snap = api.pull(str(model_dir), cache=cache_root)
    store = api.open_local_store(store_root)
    outcomes: list[Any] = []

    def run() -> None:
        both_started.wait()
        outcomes.append(convert(store, snap, "m", [("hf", {})]))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(o.reused for o in outcomes) == [False, True]
    assert {o.version.number for o in outcomes} == {1} and store.versions("m") == [1]
