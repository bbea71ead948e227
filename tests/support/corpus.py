"""The hostile corpus's promise, shared by every table of cases (tests/hostile/test_*.py): a Case says how to build
its input in a fresh World and the answer it must get; `check_case` runs it and holds it to the promise. mreg answers
with its exit code, ONE error line and a hint (a next step) on stderr, one valid JSON error document on stdout with
--json, no traceback, nothing changed outside the cache and the store, and no version or alias appearing or
disappearing in `mreg list`, the store's tree or the remote bucket."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from registry.errors import RETRYABLE
from support.cli import CliResult, run
from support.hostile import file_modes_enforced
from support.world import World, untouchable, visible

Setup = Callable[[World], Sequence[str | Path]]


@dataclass(frozen=True)
class Case:
    """One hostile input: how to make it and the command to run, then the answer it must get."""

    id: str
    setup: Setup
    code: int
    error: str | None = None  # the error type in the --json document, where one type is the contract
    says: tuple[str, ...] = ()  # words the error line must hold
    needs: str = ""  # "s3" or "hub": the case runs in that world
    unprivileged: bool = False  # file modes enforced even for root (a read-only store)
    check: Callable[[World, dict[str, Any]], None] | None = None  # what else must hold, given the error document


def refusal(r: CliResult, case: Case) -> None:
    """Exit code, one error line and one hint on stderr (warnings aside), one JSON error document on stdout."""
    assert r.exit_code == case.code, f"exit {r.exit_code}, not {case.code}:\n{r.stderr}{r.stdout}"
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    hints = [ln for ln in lines if ln.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) == 1, r.stderr
    assert all(ln.startswith(("error: ", "hint: ", "warning: ")) for ln in lines), r.stderr

    def not_json(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    doc = json.loads(r.stdout, parse_constant=not_json)  # one document: anything after it fails here
    error = doc["error"]
    assert doc["schema_version"] == 1 and error["exit_code"] == case.code, r.stdout
    assert error["message"] == errors[0].removeprefix("error: ") and error["hint"] == hints[0].removeprefix("hint: ")
    assert error["hint"].strip() and len(error["message"]) < 500, error
    # Whether a job engine should run it again: a bool, the same split as the emitted podFailurePolicy.
    assert error["retryable"] is (case.code in RETRYABLE), error
    if case.error is not None:
        assert error["type"] == case.error, error
    for word in case.says:
        assert word in error["message"], (word, error["message"])


def check_case(case: Case, request: pytest.FixtureRequest) -> CliResult:
    """Build the case in its world, run its command with --json, and hold the answer to the corpus's promise."""
    w: World = request.getfixturevalue({"s3": "s3_world", "hub": "hub_world"}.get(case.needs, "world"))
    argv = [w.src if a == "SRC" else a for a in case.setup(w)]
    before, seen = untouchable(w), visible(w)
    if case.unprivileged:
        with file_modes_enforced():
            r = run(*argv, "--json")
    else:
        r = run(*argv, "--json")
    refusal(r, case)
    assert untouchable(w) == before, "something outside the store and the cache changed"
    assert visible(w) == seen, "a version or alias appeared or vanished"
    if case.check is not None:
        case.check(w, r.json["error"])
    if case.unprivileged:  # the modes back, for pytest's cleanup
        for dirpath, _dirs, _names in os.walk(w.store):
            os.chmod(dirpath, 0o755)
    return r
