"""The registry knows formats only through its table; each converter there meets the protocol's contract; the
environment is read in one module and on-disk names are built in one."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

from registry.convert import formats

ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_imports_no_converter() -> None:
    found = []
    for path in sorted((ROOT / "registry").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "converters"]
    assert found == []


def test_every_table_row_is_a_converter_of_its_format() -> None:
    for fmt in formats.available():
        entry = formats.FORMATS[fmt]
        converter = importlib.import_module(entry.module).CONVERTER
        assert converter.format == fmt
        assert isinstance(converter.needs, tuple) and all(formats.known(n) for n in converter.needs)
    assert formats.runnable() == ["gguf", "onnx", "hf"], "mreg check's preference when no --format is given"


def test_help_imports_no_library_beyond_click() -> None:
    """`mreg --help` stays fast: no pydantic, boto3, huggingface_hub, numpy or converter at start-up."""
    code = ("import sys; from click.testing import CliRunner; from registry.cli import main; "
            "CliRunner().invoke(main, ['--help']); "
            "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'pydantic', 'boto3', 'botocore', 'huggingface_hub', 'numpy', 'converters', 'manifests'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_only_the_config_module_reads_the_environment() -> None:
    """Every variable is read through its entry in registry/config.py's catalogue (click's envvar= included), so
    that `mreg config --env` and the docs list them all and none is read in two places with two rules."""
    reads = re.compile(r"\b(environ|getenv|putenv|envvar)\b")
    found = [f"{path.relative_to(ROOT)}:{n}" for package in ("registry", "converters", "manifests")
             for path in sorted((ROOT / package).rglob("*.py")) if path != ROOT / "registry" / "config.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if reads.search(line)]
    assert found == [], "read the environment through registry.config (declare a Variable there)"


def test_on_disk_names_are_built_in_the_layout() -> None:
    """Lock files, staging trees and the OCI caches are named by registry/layout.py alone (a second spelling of a
    lock's name is a lock nobody else takes)."""
    name = re.compile(r"[\w.-]*\.lock|stage-|oci-image|oci-uploads|caches|locks")
    found = [f"{path.relative_to(ROOT)}: {node.value!r}" for package in ("registry", "converters")
             for path in sorted((ROOT / package).rglob("*.py")) if path != ROOT / "registry" / "layout.py"
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and name.fullmatch(node.value)]
    assert found == []
