"""Hostile inputs to the web view's commands (issue 32): `history --at`, `site build`, `ui`, held to the corpus's
promise (support.corpus): one error line and a hint, one JSON document, nothing outside the store touched."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from support.corpus import Case, check_case
from support.world import World

from registry import layout


def _at(when: str) -> Sequence[str | Path]:
    return ["history", "m", "--at", when]


def _bad_time(w: World) -> Sequence[str | Path]:
    w.publish()
    return _at("yesterday at noon")


def _torn_history(w: World) -> Sequence[str | Path]:
    w.publish()
    (layout.model_dir(w.store, "m") / layout.HISTORY).write_bytes(b"\xff\xfe not text\n")
    return _at("2026-01-01T00:00:00Z")


def _into_someone_elses_dir(w: World) -> Sequence[str | Path]:
    w.publish()
    mine = w.outside / "notes"
    mine.mkdir(parents=True)
    (mine / "todo.txt").write_text("keep me")
    return ["site", "build", mine]


def _onto_a_file(w: World) -> Sequence[str | Path]:
    w.publish()
    w.outside.mkdir(parents=True, exist_ok=True)
    (w.outside / "site.html").write_text("keep me")
    return ["site", "build", w.outside / "site.html"]


def _no_store(w: World) -> Sequence[str | Path]:
    return ["ui", "--store", w.root / "no-such-store", "--port", "0"]


CASES: list[Case] = [
    Case("history-at-not-a-time", _bad_time, 2, "UsageError", ("not a time",)),
    Case("history-at-torn-history", _torn_history, 4, "IntegrityError", ("history", "damaged")),
    Case("site-build-into-another-directory", _into_someone_elses_dir, 2, "UsageError", ("not a site mreg built",)),
    Case("site-build-onto-a-file", _onto_a_file, 2, "UsageError", ("not a site mreg built",)),
    Case("ui-without-a-store", _no_store, 3, "NotFound", ("no store",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_to_the_web_view(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)
