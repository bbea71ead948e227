"""Helpers shared by the ONNX converter tests: run a conversion, read its artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def convert(mreg: Any, src: Path, spec: str = "", name: str = "m") -> dict[str, Any]:
    """Run `mreg convert SRC --to onnx[:SPEC] --json`; the JSON document, exit 0 asserted."""
    r = mreg("convert", src, "--to", "onnx" + (f":{spec}" if spec else ""), "--name", name, "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    doc: dict[str, Any] = r.json
    return doc


def artifact(store_root: Path, name: str, version: int) -> tuple[dict[str, Any], Path]:
    """The onnx artifact record of a published version and its directory."""
    vdir = store_root / "models" / name / "versions" / str(version)
    manifest = json.loads((vdir / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["format"] == "onnx"]
    return art, vdir / "onnx"
