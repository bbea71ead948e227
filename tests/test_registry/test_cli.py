"""The CLI's one error boundary: every failure with --json is one JSON document on stdout."""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.mark.parametrize("args", [
    ("promote", "--json"),                                      # a missing argument
    ("convert", "x", "--to", "hf", "--bogus", "--json"),        # an unknown option
    ("check", "m@1", "--golden", "g", "--format", "tensorrt", "--json"),  # a value outside a choice
    ("nope", "--json"),                                         # an unknown command
])
def test_usage_errors_with_json_print_one_error_document(mreg: Any, args: tuple[str, ...]) -> None:
    r = mreg(*args)
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["error"]["type"] == "UsageError" and doc["error"]["exit_code"] == 2
    assert "Usage:" in r.stderr or "Error:" in r.stderr, "click's usage text stays on stderr"


def test_usage_errors_without_json_print_nothing_on_stdout(mreg: Any) -> None:
    r = mreg("promote")
    assert r.exit_code == 2 and r.stdout == "" and "Missing argument" in r.stderr
