"""Functions run in child processes by the concurrency and crash tests (importable by spawn)."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any


def flipper(store_root: str, name: str, versions: list[int], flips: int, seed: int, out: str) -> None:
    """Promote random versions `flips` times; write how many flips changed the alias."""
    from registry.release import aliases
    from registry.store.local import LocalStore

    store = LocalStore(Path(store_root))
    rnd = random.Random(seed)
    changed = 0
    for _ in range(flips):
        v = store.version(name, rnd.choice(versions))
        if aliases.promote(store, name, v).changed:
            changed += 1
    Path(out).write_text(json.dumps({"changed": changed}))


def reader(store_root: str, name: str, stop_file: str, out: str) -> None:
    """Resolve the production path in a tight loop; count reads and any that were broken."""
    alias = Path(store_root) / "models" / name / "production"
    reads = broken = 0
    errors: list[str] = []
    while not os.path.exists(stop_file):
        reads += 1
        try:
            target = os.readlink(alias)
            manifest = alias / "manifest.json"
            with open(manifest, "rb") as f:
                doc = json.loads(f.read())
            if f"versions/{doc['version']}" != target and not target.startswith("versions/"):
                raise RuntimeError(f"odd target {target}")
            os.stat(alias / "hf" / "config.json")
        except Exception as e:  # noqa: BLE001 - any failure to read is what we count
            broken += 1
            if len(errors) < 5:
                errors.append(repr(e))
    Path(out).write_text(json.dumps({"reads": reads, "broken": broken, "errors": errors}))


def publish_and_promote(cache: str, store_root: str, source: str, name: str) -> None:
    """One CI job: pull a local directory, convert (copying), promote; the crash test kills it anywhere."""
    from registry.cache import pull_local
    from registry.convert.execute import convert
    from registry.release import aliases
    from registry.store.local import LocalStore

    store = LocalStore(Path(store_root))
    snap = pull_local(Path(cache), Path(source))
    print("pulled", flush=True)
    t0 = time.monotonic()
    out = convert(store, snap, name, [("hf", {})], copy=True)
    aliases.promote(store, name, out.version)
    print(out.version.number, round(time.monotonic() - t0, 4), flush=True)


def convert_cli(out: str, markers: str, delay_s: str, *argv: str) -> None:
    """One runner's `mreg ARGV…` (a convert --to hf): its hf converter leaves a marker named by its pid in `markers`
    (what the race tests count), then sleeps `delay_s` (a slow conversion to race with, or to kill); the exit code,
    stdout and stderr go to `out`."""
    from converters.hf.converter import HFConverter
    from support.cli import run

    real = HFConverter.convert

    def counted(self: HFConverter, request: Any) -> Any:
        Path(markers, f"converting-{os.getpid()}").touch()
        time.sleep(float(delay_s))
        return real(self, request)

    HFConverter.convert = counted  # type: ignore[method-assign]
    r = run(*argv)
    Path(out).write_text(json.dumps({"exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}))


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])


def s3_promoter(url: str, name: str, versions: list[int], attempts: int, seed: int, out: str) -> None:
    """Promote random versions through an S3 store; count wins, losses (Conflict) and no-ops."""
    from registry.errors import Conflict
    from registry.release import aliases
    from registry.store.s3 import S3Store

    store = S3Store(url)
    rnd = random.Random(seed)
    won = lost = noop = 0
    other: list[str] = []
    for _ in range(attempts):
        try:
            change = aliases.promote(store, name, store.version(name, rnd.choice(versions)))
            if change.changed:
                won += 1
            else:
                noop += 1
        except Conflict:
            lost += 1
        except Exception as e:  # noqa: BLE001 - reported to the test
            other.append(repr(e))
    Path(out).write_text(json.dumps({"won": won, "lost": lost, "noop": noop, "other_errors": other}))
