"""What an intruder does to a store, and what a refusal must look like: helpers for the trust-boundary tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


def files(d: Path) -> dict[str, bytes]:
    """Every file under `d` and its bytes, and every symlink and its target (links not followed)."""
    out = {}
    for dirpath, dirs, names in os.walk(d):
        for fn in names + dirs:
            p = Path(dirpath) / fn
            if p.is_symlink():
                out[p.relative_to(d).as_posix()] = b"-> " + os.readlink(p).encode()
            elif fn in names:
                out[p.relative_to(d).as_posix()] = p.read_bytes()
    return out


def link_out(root: Path, rel: str, outside: Path) -> Path:
    """Move `rel` of the store to `outside` (plus a file of its own) and leave a symlink to it in its place."""
    inside = root / rel
    if inside.is_dir():
        shutil.copytree(inside, outside, symlinks=True)
        (outside / "precious.txt").write_text("not the store's to delete")
        for dirpath, _dirs, _names in os.walk(inside):
            os.chmod(dirpath, 0o755)  # published trees are read-only
        shutil.rmtree(inside)
    else:  # a file: the same bytes, but not the store's
        outside.mkdir()
        shutil.copy(inside, outside / inside.name)
        inside.unlink()
        outside = outside / inside.name
    os.symlink(outside, inside)
    return outside


def refused(r: Any, *words: str) -> None:
    """Exit 4, one error line and its hint on stderr, an IntegrityError in the --json document on stdout."""
    assert r.exit_code == 4, r.stderr + r.stdout
    error, hint = r.stderr.splitlines()
    assert error.startswith("error: ") and hint.startswith("hint: "), r.stderr
    assert r.json["error"]["type"] == "IntegrityError" and r.json["error"]["hint"], r.stdout
    for w in words:
        assert w in error, error
