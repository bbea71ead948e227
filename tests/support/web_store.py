"""Stores for the web view's tests and benchmark: one real conversion, copied into many versions in seconds.

`copy_versions` writes what `LocalStore.publish` would (a version directory of hard links to the same blobs,
its manifest written last) for every model and number, with the manifest's name, number, parent, time and key
changed; aliases and their history go through the store's own `set_alias` and `append_history`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests import CheckRecord, HistoryEntry, Manifest
from registry import layout
from registry.store.local import LocalStore
from registry.store.protocol import manifest_bytes
from support.cli import ok, run
from support.pki import write_key
from support.tiny_models import build_tiny_llama

START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def copy_versions(store: LocalStore, base: Path, models: list[str], versions: int, *,
                  flips: int = 3) -> None:
    """`versions` versions of each model, copies of the version at `base`, a day apart; `production` promoted
    `flips` times (the last to the newest version) and `staging` at the newest, each with its history."""
    manifest = Manifest.model_validate_json((base / layout.MANIFEST).read_bytes())
    files = [(a.path, f.path) for a in manifest.artifacts for f in a.files]
    for name in models:
        vdir = layout.versions_dir(store.root, name)
        vdir.mkdir(parents=True, exist_ok=True)
        for n in range(1, versions + 1):
            dest = vdir / str(n)
            for art, rel in files:
                (dest / art / rel).parent.mkdir(parents=True, exist_ok=True)
                os.link(base / art / rel, dest / art / rel)
            m = manifest.model_copy(update={
                "name": name, "version": n, "parent": n - 1 if n > 1 else None,
                "key": hashlib.sha256(f"{name}/{n}".encode()).hexdigest(),
                "created": manifest.created.model_copy(update={"at": START + dt.timedelta(days=n)})})
            (dest / layout.MANIFEST).write_bytes(manifest_bytes(m))
        targets = sorted({max(1, versions - 2 * i) for i in range(flips)})
        before: int | None = None
        for i, target in enumerate(targets):
            promote(store, name, "production", before, target, START + dt.timedelta(days=target, hours=1 + i))
            before = target
        promote(store, name, "staging", None, versions, START + dt.timedelta(days=versions, hours=2))


def promote(store: LocalStore, name: str, alias: str, before: int | None, to: int, at: dt.datetime,
            reason: str | None = None, action: str = "promote") -> None:
    """Flip an alias and record it at a chosen time, as `mreg promote` would have then."""
    manifest_path = layout.version_dir(store.root, name, to) / layout.MANIFEST
    created = Manifest.model_validate_json(manifest_path.read_bytes()).created
    entry = HistoryEntry.model_validate({
        "alias": alias, "action": action, "from": before, "to": to, "reason": reason,
        "by": created.model_copy(update={"at": at, "user": "release-bot"}).model_dump()})
    store.set_alias(name, alias, to)
    store.append_history(name, entry)


PAYLOAD = "<img src=x onerror=alert(1)>"


@dataclass
class WebStore:
    """The store, and the names and times the tests look for."""

    root: Path
    store: Path
    history: list[dict[str, Any]]

    def cli(self, *args: str) -> Any:
        """`mreg ARGS --store STORE --json`, exit 0 asserted: its document."""
        return ok(run(*args, "--store", str(self.store), "--json"))


def small_store(root: Path) -> WebStore:
    """Real conversions and promotions of `alpha` (one reason is an HTML payload; version 3 adds a file), copied
    versions of `beta` and `gamma`, and `broken`, damaged three ways (see `damage`). The environment must point
    MREG_STORE at ROOT/store and the cache, home and config into ROOT."""
    store = root / "store"
    for seed in range(3):
        src = build_tiny_llama(root / f"src{seed}", seed=seed)
        if seed == 2:
            (src / "NOTICE.md").write_text("# Notice\n")
        ok(run("convert", src, "--to", "hf", "--name", "alpha", "--json"))
    ok(run("promote", "alpha@1", "-m", "first release", "--json"))
    ok(run("promote", "alpha@2", "-m", PAYLOAD, "--json"))
    ok(run("promote", "alpha@3", "--alias", "staging", "--json"))
    keys, _ = write_key(root / "keys", "release")
    ok(run("sign", "alpha@2", "--key", keys.private, "--signer", "release-bot", "--json"))
    record_check(LocalStore(store), "alpha", 2, passed=True)
    record_check(LocalStore(store), "alpha", 3, passed=False)
    history = ok(run("history", "alpha", "--json"))["entries"]
    st = LocalStore(store)
    base = layout.version_dir(store, "alpha", 1)
    copy_versions(st, base, ["beta", "gamma"], 4)
    copy_versions(st, base, ["broken"], 3)
    damage(store)
    return WebStore(root, store, history)


def record_check(store: LocalStore, name: str, number: int, *, passed: bool) -> None:
    """A golden-check record as `mreg check` keeps it (one case, llama.cpp on a CPU)."""
    v = store.version(name, number)
    record = CheckRecord.model_validate({
        "name": name, "version": number, "manifest_sha256": v.manifest_sha256, "golden": "smoke",
        "golden_sha256": "ab" * 32, "format": "hf", "runtime": "transformers", "runtime_version": "5.0",
        "hardware": "cpu", "passed": passed, "keyword_hit_rate": 1.0 if passed else 0.5, "min_keyword_hit_rate": 0.8,
        "latency_p50_ms": 12.0, "latency_p95_ms": 15.0, "at": v.manifest.created.at, "by": v.manifest.created,
        "cases": [{"id": "hello", "passed": passed, "prompt_tokens": 3, "latency_ms": 12.0}]})
    d = layout.checks_dir(store.root, name, number)
    d.mkdir(parents=True, exist_ok=True)
    (d / layout.check_record_name("20260101T000000000000Z", "smoke", record.golden_sha256)).write_text(
        record.model_dump_json())


def damage(store: Path) -> None:
    """`broken`: version 2's manifest does not parse, `production` leads out of the store, the history is not text."""
    manifest = layout.version_dir(store, "broken", 2) / layout.MANIFEST
    os.chmod(manifest, 0o644)
    manifest.write_text("{ not a manifest")
    alias = layout.alias_path(store, "broken", "production")
    alias.unlink()
    alias.symlink_to("/etc")
    (layout.model_dir(store, "broken") / layout.HISTORY).write_bytes(b"\xff\xfe\x00 torn\n")
