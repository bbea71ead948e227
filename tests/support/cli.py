"""The one way tests run the `mreg` command in-process, and helpers for conversions run through it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from registry.cli import main


@dataclass
class CliResult:
    """What one CLI run printed and returned."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """The JSON document on stdout."""
        return json.loads(self.stdout)


def run(*args: str | Path) -> CliResult:
    """Run `mreg ARGS...` in-process; stdout, stderr and the exit code."""
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


def ok(result: CliResult) -> Any:
    """The JSON document of a run that must succeed (give it --json)."""
    assert result.exit_code == 0, result.stderr + result.stdout
    return result.json


def convert(mreg: Any, src: Path, target: str, name: str = "m") -> dict[str, Any]:
    """Run `mreg convert SRC --to TARGET --name NAME --json`; the JSON document, exit 0 asserted."""
    doc: dict[str, Any] = ok(mreg("convert", src, "--to", target, "--name", name, "--json"))
    return doc


def artifact(store_root: Path, name: str, version: int, fmt: str) -> tuple[dict[str, Any], Path]:
    """The `fmt` artifact record of a published version and its directory."""
    vdir = store_root / "models" / name / "versions" / str(version)
    manifest = json.loads((vdir / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["format"] == fmt]
    return art, vdir / fmt


def integrity_refusal(result: CliResult, store_root: Path, name: str, *needles: str) -> dict[str, Any]:
    """The `--json` error of a conversion refused as an integrity failure (exit 4) whose message names every
    needle; the document is strict JSON (no NaN) and no version of `name` was published."""

    def not_json(constant: str) -> Any:
        raise AssertionError(f"{constant} in the error document is not JSON")

    assert result.exit_code == 4, result.stderr + result.stdout
    error: dict[str, Any] = json.loads(result.stdout, parse_constant=not_json)["error"]
    assert error["type"] == "IntegrityError" and error["exit_code"] == 4
    for needle in needles:
        assert needle in error["message"], f"{needle!r} not in {error['message']!r}"
    assert not (store_root / "models" / name / "versions" / "1" / "manifest.json").exists(), "nothing published"
    return error
