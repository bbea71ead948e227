"""The world a hostile case runs in (tests/hostile): a store, a cache, a source model, a directory mreg must never
touch, and for some cases a real S3 server or a local hub; and what "nothing changed" and "nothing visible" mean."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.cli import run
from support.hub_server import LocalHub
from support.s3_server import SeaweedS3

BUCKET = "mreg-hostile"


@dataclass
class World:
    """Where one case runs; `outside` holds files that belong to nobody's store."""

    root: Path
    store: Path
    cache: Path
    template: Path
    remote: str = ""
    s3: SeaweedS3 | None = None
    hub: LocalHub | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def outside(self) -> Path:
        """A sibling of the store and cache that no command may change."""
        return self.root / "outside"

    @property
    def src(self) -> Path:
        """A tiny llama source directory (config, tokenizer, safetensors), a fresh copy per case."""
        dest = self.root / "src"
        if not dest.exists():
            shutil.copytree(self.template, dest)
        return dest

    def publish(self, versions: int = 1, name: str = "m") -> None:
        """`versions` versions of `name` converted --to hf from the source (each with its own config)."""
        config = json.loads((self.src / "config.json").read_text())
        for i in range(versions):
            (self.src / "config.json").write_text(json.dumps({**config, "mreg_test_version": i}))
            r = run("convert", self.src, "--to", "hf", "--name", name, "--json")
            assert r.exit_code == 0, r.stderr
        (self.src / "config.json").write_text(json.dumps(config))

    def pushed(self) -> None:
        """Version 1 of m published, pushed to the remote and promoted there."""
        self.publish()
        for args in (("push", "m@1", self.remote), ("promote", "m@1", "--store", self.remote)):
            r = run(*args, "--json")
            assert r.exit_code == 0, r.stderr

    def forget_local(self) -> None:
        """Remove the local store (its trees are read-only), as on a serving node that syncs from the remote."""
        for dirpath, _dirs, _names in os.walk(self.store):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(self.store)

    def object(self, key: str) -> bytes:
        """An object of the remote bucket."""
        assert self.s3 is not None
        return bytes(self.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def put(self, key: str, data: bytes) -> None:
        """Write an object behind mreg's back (what anyone who can write the bucket can do)."""
        assert self.s3 is not None
        self.s3.client().put_object(Bucket=BUCKET, Key=key, Body=data)

    def key(self, *parts: str) -> str:
        """The object key of a path inside the remote store."""
        return "/".join([self.remote.split("/", 3)[3], *parts])


def tree(root: Path, skip: set[Path]) -> dict[str, tuple[Any, ...]]:
    """Every entry under `root` (links not followed, `skip` left out): its kind, mode, mtime and content digest."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if Path(dirpath) / d not in skip]
        for n in dirs + names:
            p = Path(dirpath) / n
            if p in skip:
                continue
            st = os.lstat(p)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            elif p.is_file():
                out[rel] = ("file", st.st_mode, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            else:  # a FIFO or socket: never opened
                out[rel] = ("other", st.st_mode, st.st_mtime_ns)
    return out


def untouchable(world: World) -> dict[str, Any]:
    """What must not change: everything beside the store and the cache, and mreg's names in the system temp dir."""
    temp = sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith("mreg"))
    return {"tree": tree(world.root, {world.store, world.cache}), "system temp": temp}


def visible(world: World) -> dict[str, Any]:
    """What a reader sees of the stores: `mreg list`, every published version and alias (local and remote)."""
    seen: dict[str, Any] = {}
    models = world.store / "models"
    if models.is_dir() and not models.is_symlink():
        for m in sorted(models.iterdir()):
            versions = m / "versions"
            if versions.is_dir() and not versions.is_symlink():
                seen[m.name] = sorted((v.name, (v / "manifest.json").exists()) for v in versions.iterdir())
            seen[f"{m.name} aliases"] = sorted((a.name, os.readlink(a)) for a in m.iterdir() if a.is_symlink())
    listed = run("list", "--json")  # no store yet (exit 3) shows no versions, as an empty one made since does
    seen["mreg list"] = (listed.json["models"] if listed.exit_code == 0 else [] if listed.exit_code == 3
                         else (listed.exit_code, listed.json["error"]["type"]))
    if world.remote and world.s3 is not None:
        pages = world.s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=world.key())
        seen["remote"] = sorted((o["Key"], o["ETag"]) for page in pages for o in page.get("Contents", [])
                                if "lease" not in o["Key"] and "gc.lock" not in o["Key"])
    return seen
