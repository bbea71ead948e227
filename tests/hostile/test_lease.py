"""Hostile inputs around conversion leases (issue 31): a lease another machine holds, a lease file mreg did not
write, a lease duration that is not one. Held to the corpus's promise (support.corpus)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.world import World

from registry import layout
from registry.api import open_s3_store
from registry.cache import pull_local
from registry.convert.execute import planned
from registry.store.lease import FileSlot, LeaseSlot, new_doc


def _key(w: World) -> str:
    """The key of `convert SRC --to hf` (the source pulled into the cache, as the command would)."""
    return planned(pull_local(w.cache, w.src), [("hf", {})])[2]


def _slot(w: World, key: str) -> LeaseSlot:
    return open_s3_store(w.remote).conversion_slot("m", key) if w.remote else FileSlot(w.store, "m", key)


def _held_elsewhere(no_wait: bool = True) -> Setup:
    """A live lease on this conversion, held by a run on another machine."""
    def setup(w: World) -> Sequence[str | Path]:
        key = _key(w)
        doc = new_doc("m", key, 3600).model_copy(update={"host": "runner-7", "pid": 4242})
        assert _slot(w, key).create(doc.model_dump_json().encode()) is not None
        store = ["--store", w.remote] if w.remote else []
        return ["convert", w.src, "--to", "hf", "--name", "m", *store, *(["--no-wait"] if no_wait else [])]
    return setup


def _garbage_lease(w: World) -> Sequence[str | Path]:
    """A lease file that is not one mreg wrote (or one cut short while written): held, by an unknown holder."""
    w.store.mkdir(parents=True, exist_ok=True)
    assert FileSlot(w.store, "m", _key(w)).create(b'{"pid": ') is not None
    return ["convert", w.src, "--to", "hf", "--name", "m", "--no-wait"]


CASES: list[tuple[Case, dict[str, str]]] = [
    (Case("lease-held-elsewhere-no-wait", _held_elsewhere(), 5, "LeaseHeld", ("runner-7 pid 4242", "since")), {}),
    (Case("lease-held-elsewhere-no-wait-s3", _held_elsewhere(), 5, "LeaseHeld", ("runner-7 pid 4242",), needs="s3"),
     {}),
    (Case("lease-file-not-mreg's-no-wait", _garbage_lease, 5, "LeaseHeld", ("unknown host",)), {}),
    (Case("lease-seconds-not-a-number", lambda w: ["convert", w.src, "--to", "hf", "--name", "m"], 2, "UsageError",
          ("MREG_LEASE_SECONDS=soon",)), {"MREG_LEASE_SECONDS": "soon"}),
    (Case("lease-seconds-arabic-digits", lambda w: ["convert", w.src, "--to", "hf", "--name", "m"], 2, "UsageError",
          ("MREG_LEASE_SECONDS",)), {"MREG_LEASE_SECONDS": "١٢٠"}),  # float() reads it as 120
    (Case("lease-seconds-zero", lambda w: ["convert", w.src, "--to", "hf", "--name", "m"], 2, "UsageError",
          ("MREG_LEASE_SECONDS=0",)), {"MREG_LEASE_SECONDS": "0"}),
]


@pytest.mark.parametrize(("case", "env"), CASES, ids=[c.id for c, _ in CASES])
def test_lease_case(case: Case, env: dict[str, str], request: pytest.FixtureRequest,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    check_case(case, request)


@pytest.mark.slow
def test_a_lease_file_not_mreg_wrote_is_taken_over_after_one_duration(world: World,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Junk where the lease lives delays the conversion by one lease duration, no more; then it is replaced, the
    version published, and the junk gone."""
    monkeypatch.setenv("MREG_LEASE_SECONDS", "1")
    _garbage_lease(world)
    t0 = time.monotonic()
    r = run("convert", world.src, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 0 and r.json["reused"] is False, r.stderr
    assert 1 <= time.monotonic() - t0 < 15
    assert "is not one mreg wrote" in r.stderr
    assert not list((world.store / layout.LOCKS).glob("*" + layout.LEASE_SUFFIX))
