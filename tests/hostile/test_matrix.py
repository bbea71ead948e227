"""Hostile matrices (issue 31): `mreg plan` and `mreg convert --matrix` refuse a bad matrix file with one line naming
the key, before any conversion, and say whether a job engine should retry (an unreachable hub: yes; a bad file: no).
Each case is held to the corpus's promise (support.corpus)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from support.corpus import Case, Setup, check_case
from support.world import World

GOOD_MODEL = '[[models]]\nname = "m"\nsource = "{src}"\ntargets = ["hf"]\n'


def _plan(text: str, *extra: str, command: Sequence[str] = ("plan",)) -> Setup:
    """Write the matrix (`{src}`: the world's source, `{store}`: its store) beside the store, then run on it."""
    def setup(w: World) -> Sequence[str | Path]:
        path = w.root / "m.toml"
        path.write_text(text.format(src=w.src, store=w.store))
        return [*command, path, *extra]
    return setup


def _convert(text: str, *extra: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        path = w.root / "m.toml"
        path.write_text(text.format(src=w.src, store=w.store))
        return ["convert", "--matrix", path, *extra]
    return setup


STORE = 'store = "{store}"\n'
GOOD = STORE + GOOD_MODEL

CASES = [
    Case("unknown top-level key", _plan('colour = "red"\n' + GOOD), 2, "UsageError", (": colour: unknown key",)),
    Case("unknown model key", _plan(GOOD.replace('targets', 'flavour = "x"\ntargets')), 2, "UsageError",
         ("models[0].flavour", "unknown key")),
    Case("missing targets", _plan(STORE + '[[models]]\nname = "m"\nsource = "{src}"\n'), 2, "UsageError",
         ("models[0].targets", "missing")),
    Case("empty targets", _plan(GOOD.replace('["hf"]', "[]")), 2, "UsageError", ("models[0].targets",)),
    Case("targets not a list", _plan(GOOD.replace('["hf"]', '"hf"')), 2, "UsageError", ("models[0].targets",)),
    Case("missing store", _plan(GOOD_MODEL), 2, "UsageError", ("store", "missing")),
    Case("no models", _plan(STORE), 2, "UsageError", ("models", "missing")),
    Case("a path as the name", _plan(GOOD.replace('name = "m"', 'name = "../m"')), 2, "UsageError",
         ("models[0].name",)),
    Case("not TOML", _plan("store = [\n"), 2, "UsageError", ("not valid TOML",)),
    Case("no such matrix", lambda w: ["plan", w.root / "missing.toml"], 3, "NotFound", ("does not exist",)),
    Case("unknown format", _plan(GOOD.replace('["hf"]', '["hf", "gguff:Q8_0"]')), 2, "UsageError",
         ("models[0].targets[1]", "gguff")),
    Case("bad gguf type", _plan(GOOD.replace('["hf"]', '["gguf:Q9_9"]')), 2, "UsageError",
         ("models[0].targets[0]",)),
    Case("a target twice", _plan(GOOD.replace('["hf"]', '["hf", "hf"]')), 2, "UsageError",
         ("models[0].targets[1]", "repeats models[0].targets[0]")),
    Case("gpus without tensorrt", _plan(GOOD.replace('targets', 'gpus = ["sm_89"]\ntargets')), 2, "UsageError",
         ("models[0].gpus",)),
    Case("a gpu that is no name", _plan(GOOD.replace('["hf"]', '["tensorrt"]\ngpus = ["H100 80GB; rm -rf /"]')),
         2, "UsageError", ("models[0].gpus[0]",)),
    Case("gpus and a target= both", _plan(GOOD.replace('["hf"]', '["tensorrt:target=sm_86"]\ngpus = ["sm_89"]')),
         2, "UsageError", ("models[0].targets[0]", "gpus")),
    Case("a bare hub name", _plan(GOOD.replace('"{src}"', '"gpt2"')), 2, "UsageError",
         ("models[0].source", "gpt2")),
    Case("unreachable hub: retryable", _plan(GOOD.replace('"{src}"', '"org/absent"'), "--endpoint",
                                             "http://127.0.0.1:9"), 9, "HubUnavailable", ("cannot reach the hub",)),
    Case("item out of range", _convert(GOOD, "--item", "7"), 2, "UsageError", ("has 1 items", "--item 7")),
    Case("among out of range", _convert(GOOD, "--item", "2", "--among", "0"), 2, "UsageError", ("--among",)),
    Case("among not numbers", _convert(GOOD, "--item", "0", "--among", "a,b"), 2, "UsageError", ("--among",)),
    Case("matrix without item", _convert(GOOD), 2, "UsageError", ("--item",)),
    Case("matrix and a source", _convert(GOOD, "--item", "0", "--to", "hf"), 2, "UsageError", ("--matrix",)),
    Case("item without matrix", lambda w: ["convert", w.src, "--to", "hf", "--name", "m", "--item", "0"], 2,
         "UsageError", ("--matrix",)),
    Case("no source and no matrix", lambda w: ["convert", "--to", "hf"], 2, "UsageError", ("SOURCE",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_matrix(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)
