"""Helpers shared by the converter tests: run a conversion through the CLI, read its artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def convert(mreg: Any, src: Path, target: str, name: str = "m") -> dict[str, Any]:
    """Run `mreg convert SRC --to TARGET --name NAME --json`; the JSON document, exit 0 asserted."""
    r = mreg("convert", src, "--to", target, "--name", name, "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    doc: dict[str, Any] = r.json
    return doc


def artifact(store_root: Path, name: str, version: int, fmt: str) -> tuple[dict[str, Any], Path]:
    """The `fmt` artifact record of a published version and its directory."""
    vdir = store_root / "models" / name / "versions" / str(version)
    manifest = json.loads((vdir / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["format"] == fmt]
    return art, vdir / fmt
