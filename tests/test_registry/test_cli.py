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


def test_a_store_that_is_missing_or_a_file_is_not_an_empty_store(mreg: Any, tmp_path: Any) -> None:
    missing = mreg("list", "--store", tmp_path / "nowhere", "--json")
    assert missing.exit_code == 3 and "there is no store" in missing.json["error"]["message"]
    (tmp_path / "file").write_text("x")
    for args in (("list",), ("show", "m@1"), ("history", "m")):
        r = mreg(*args, "--store", tmp_path / "file", "--json")
        assert r.exit_code == 2 and "is a file" in r.json["error"]["message"], args


def test_history_of_a_model_that_is_not_there_is_not_found(mreg: Any, tmp_path: Any) -> None:
    (tmp_path / "store").mkdir(exist_ok=True)
    r = mreg("history", "nope", "--json")
    assert r.exit_code == 3 and r.json["error"]["type"] == "ModelNotFound"
    assert mreg("show", "nope", "--json").exit_code == 3, "as show says"
