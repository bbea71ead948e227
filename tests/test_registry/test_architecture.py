"""The registry knows formats only through its table; each converter there meets the protocol's contract."""

from __future__ import annotations

import ast
import importlib
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
