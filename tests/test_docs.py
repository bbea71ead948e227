"""The documentation's reference pages that must follow the code: environment variables, schemas, benchmarks."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("registry", "converters", "manifests")
NAME = re.compile(r"MREG_[A-Z][A-Z0-9_]*")


def _mreg_names_in_code() -> dict[str, str]:
    """Every `MREG_*` name in a string of the packages' code (what is read from, or set in, an environment),
    with one file that names it. Identifiers (`media.MREG_PATH`, an OCI annotation's constant) are not strings."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for name in NAME.findall(node.value):
                        found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_environment_variable_the_code_names_is_documented() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    documented = set(NAME.findall(page))
    names = _mreg_names_in_code()
    # The variables the brief of this page names must be found by the scan, or the scan itself is broken.
    assert {"MREG_CACHE_DIR", "MREG_STORE", "MREG_CONFIG", "MREG_USER", "MREG_DEBUG"} <= set(names)
    missing = {name: where for name, where in names.items() if name not in documented}
    assert missing == {}, f"add these to docs/reference/environment.md: {missing}"


def test_the_schema_page_includes_every_exported_schema() -> None:
    page = (ROOT / "docs" / "reference" / "manifest-schema.md").read_text(encoding="utf-8")
    included = set(re.findall(r'--8<-- "(manifests/schema/[^"]+)"', page))
    exported = {str(p.relative_to(ROOT)) for p in (ROOT / "manifests" / "schema").glob("*.json")}
    assert included == exported


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if f": {p}\n" not in nav} == set()


def test_benchmarks_page_renders_each_run_with_its_date_and_machine(tmp_path: Path) -> None:
    run = {"date": "2026-12-03T16:00:00+00:00", "machine": "bench-host", "platform": "Linux-6.1-x86_64",
           "cpus": 2, "memory_bytes": 24 << 30, "python": "3.11.9",
           "flip_10MB": {"promote_ms_median": 1.25, "rollback_ms_median": 1.5}, "onnx_minilm_skipped": "not installed"}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(run))
    out = tmp_path / "benchmarks.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), str(src), "--out", str(out)], check=True)
    text = out.read_text(encoding="utf-8")
    assert "## Run of 2026-12-03 16:00 UTC on bench-host" in text
    assert "| `flip_10MB.promote_ms_median` | 1.25 |" in text
    assert "not installed" in text
    assert "## Recorded figures" in text  # the figures measured before bench.json carried them stay on the page


def test_the_committed_benchmarks_page_is_what_render_writes() -> None:
    """docs/benchmarks.md is generated: `python benchmarks/render.py` (no run committed) must reproduce it."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_environment_table_lists_the_catalogue() -> None:
    """The page's "Read by mreg" table names every variable registry.config declares, and no MREG_* variable that
    the catalogue does not declare (a variable read without its entry would escape `mreg config --env`)."""
    from registry.config import VARIABLES

    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    section = page.split("## Read by mreg", 1)[1].split("\n## ", 1)[0]
    listed = {name for row in section.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split(" | ")[0])}
    declared = {v.name for v in VARIABLES}
    assert declared - listed == set(), "add these to the table of docs/reference/environment.md"
    assert {n for n in listed if n.startswith("MREG_")} - declared == set(), "declare these in registry/config.py"
