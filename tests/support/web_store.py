"""Stores for the web view's tests and benchmark: one real conversion, copied into many versions in seconds.

`copy_versions` writes what `LocalStore.publish` would (a version directory of hard links to the same blobs,
its manifest written last) for every model and number, with the manifest's name, number, parent, time and key
changed; aliases and their history go through the store's own `set_alias` and `append_history`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path

from manifests import HistoryEntry, Manifest
from registry import layout
from registry.store.local import LocalStore
from registry.store.protocol import manifest_bytes

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
