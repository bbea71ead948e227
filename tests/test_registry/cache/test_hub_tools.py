"""A cache mreg filled is one huggingface_hub's own tools read without a complaint: `scan_cache_dir` and the `hf cache`
commands (ls, verify, prune, rm) run for real against it, and mreg still answers correctly after each of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import scan_cache_dir
from support.hub_server import LocalHub
from test_registry.cache.test_pull import files

from registry import layout

HF = str(Path(sys.executable).with_name("hf"))


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    """A local hub on 127.0.0.1, stopped after the test."""
    with LocalHub() as h:
        yield h


def hf(cache: Path, *args: str, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run huggingface_hub's own `hf cache …` command against the cache (offline unless given an endpoint)."""
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    if endpoint is None:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = endpoint
    return subprocess.run([HF, "cache", *args, "--cache-dir", str(cache)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def filled(mreg: Any, hub: LocalHub, model_dir: Path) -> tuple[str, str]:
    """A hub repository pulled at two commits (the first left detached when the branch moves on) and a local
    directory imported; the two commits."""
    old = hub.add_commit("org/tiny", files(0))
    assert mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json").exit_code == 0
    new = hub.add_commit("org/tiny", files(1))
    assert mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json").exit_code == 0
    assert mreg("pull", model_dir, "--json").exit_code == 0
    return old, new


def test_the_hub_scanner_finds_nothing_wrong(mreg: Any, hub: LocalHub, model_dir: Path, cache_root: Path) -> None:
    old, new = filled(mreg, hub, model_dir)
    info = scan_cache_dir(cache_root)
    assert info.warnings == [], info.warnings
    tiny = {r.repo_id: r for r in info.repos}["org/tiny"]
    assert {rev.commit_hash for rev in tiny.revisions} == {old, new}
    assert len(info.repos) == 2, "the local import is a repository of its own"
    listed = hf(cache_root, "ls", "--show-warnings", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert "inconsisten" not in listed.stdout + listed.stderr.lower(), listed.stdout + listed.stderr
    assert "org/tiny" in listed.stdout


def test_hf_cache_verify_accepts_what_mreg_pulled(mreg: Any, hub: LocalHub, model_dir: Path,
                                                  cache_root: Path) -> None:
    _old, new = filled(mreg, hub, model_dir)
    r = hf(cache_root, "verify", "org/tiny", "--revision", new, "--format", "json", endpoint=hub.endpoint)
    assert r.returncode == 0, r.stdout + r.stderr


def test_prune_and_rm_leave_mreg_answering_right(mreg: Any, hub: LocalHub, model_dir: Path,
                                                 cache_root: Path) -> None:
    old, new = filled(mreg, hub, model_dir)
    pruned = hf(cache_root, "prune", "--yes")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert not layout.cache_snapshot_dir(cache_root, "org/tiny", old).exists(), "the detached commit is pruned"
    gone = mreg("pull", f"org/tiny@{old}", "--offline", "--json")
    assert gone.exit_code == 3 and "not in the cache" in gone.json["error"]["message"]
    kept = mreg("pull", "org/tiny", "--offline", "--json")
    assert kept.exit_code == 0 and kept.json["commit"] == new and kept.json["from_cache"] is True
    removed = hf(cache_root, "rm", "model/org/tiny", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    after = mreg("pull", "org/tiny", "--offline", "--json")
    assert after.exit_code == 3 and "not in the cache" in after.json["error"]["message"]
    assert scan_cache_dir(cache_root).warnings == []
    again = mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json")
    assert again.exit_code == 0 and again.json["commit"] == new and again.json["from_cache"] is False


def test_a_record_an_earlier_mreg_kept_at_the_top_is_moved_in(mreg: Any, hub: LocalHub, cache_root: Path) -> None:
    commit = hub.add_commit("org/tiny", files(0))
    assert mreg("pull", "org/tiny", "--endpoint", hub.endpoint, "--json").exit_code == 0
    record = layout.pull_record_path(cache_root, "org/tiny", commit)
    legacy = layout.legacy_pull_record_path(cache_root, "org/tiny", commit)
    legacy.parent.mkdir(parents=True)
    shutil.move(record, legacy)
    assert scan_cache_dir(cache_root).warnings, "the old place is what the hub's scanner complained about"
    hub.reset_counters()
    r = mreg("pull", f"org/tiny@{commit}", "--endpoint", hub.endpoint, "--json")
    assert r.exit_code == 0 and r.json["from_cache"] is True and hub.requests == [], "not verified again"
    assert json.loads(record.read_bytes())["source"]["commit"] == commit
    assert not (cache_root / layout.CACHE_MREG).exists()
    assert scan_cache_dir(cache_root).warnings == []
