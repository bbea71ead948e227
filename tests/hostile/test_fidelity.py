"""Fidelity (issue 34): a record never claims a check that did not run, and what a model's own files say about it
(its model card) cannot break a conversion.

The table: promotions that `--require loaded` must refuse, a GGUF that llama.cpp never loaded (converted as in a
plain install, without llama-cpp-python) and one an older mreg recorded as passed with only its `detail` saying so.
The plain tests: model cards that are hostile YAML, huge or of the wrong shape give a conversion that publishes
under the name llama.cpp's converter would fall back to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.absent import without_llama_cpp
from support.cli import run
from support.corpus import Case, check_case
from support.world import World

from converters.gguf.naming import general_name

pytest.importorskip("gguf")
def _convert_unloaded(w: World, name: str = "m") -> None:
    """A GGUF version converted as a plain install converts it: llama-cpp-python absent."""
    with without_llama_cpp():
        r = run("convert", w.src, "--to", "gguf:F16", "--name", name, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["verification"] == {"gguf": "structural"}


def _unloaded(w: World) -> Sequence[str | Path]:
    _convert_unloaded(w)
    return ["promote", "m@1", "--require", "loaded"]


def _unloaded_gguf_scoped(w: World) -> Sequence[str | Path]:
    _convert_unloaded(w)
    return ["promote", "m@1", "--require", "gguf:loaded"]


def _legacy(w: World) -> Sequence[str | Path]:
    """The manifest an older mreg wrote: `passed`, llama.cpp's checks in the method, `detail` alone telling."""
    _convert_unloaded(w)
    path = w.store / "models" / "m" / "versions" / "1" / "manifest.json"
    doc = json.loads(path.read_text())
    v = doc["artifacts"][0]["verification"]
    del v["not_run"]
    v.update(status="passed", detail="llama.cpp runtime not installed (pip install 'mreg[gguf]'): not loaded",
             method=v["method"] + "; llama.cpp: load, tokenization against the HF tokenizer, logits against mreg's "
                                  "streaming float32 forward pass of the safetensors source")
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc, indent=2))
    return ["promote", "m@1", "--require", "loaded"]


def _in_config(w: World) -> Sequence[str | Path]:
    """`require = ["loaded"]` under [models.m] in the config file, as a team sets it once."""
    _convert_unloaded(w)
    config = w.root / "mreg.toml"
    config.write_text('[models.m]\nrequire = ["loaded"]\n')
    return ["promote", "m@1", "--config", config]


CASES: list[Case] = [
    Case("GGUF never loaded by llama.cpp: promote --require loaded", _unloaded, 6, "GateRefused",
         ("never loaded", "not loaded by llama.cpp")),
    Case("GGUF never loaded by llama.cpp: promote --require gguf:loaded", _unloaded_gguf_scoped, 6, "GateRefused",
         ("never loaded by llama.cpp",)),
    Case("GGUF an older mreg recorded as passed: promote --require loaded", _legacy, 6, "GateRefused",
         ("never loaded", "not loaded by llama.cpp")),
    Case("GGUF never loaded, require = loaded in the config", _in_config, 6, "GateRefused", ("never loaded",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_unloaded_artifacts_are_refused(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)


#: Model cards llama.cpp's converter would stop on or misread; mreg falls back to the next source of a name.
CARDS: dict[str, bytes] = {
    "python tag": b"---\nname: !!python/object/apply:os.system ['touch HOSTILE']\n---\n",
    "name not a string": b"---\nname: [1, 2]\nmodel_name: {a: b}\n---\n",
    "not a mapping": b"---\n- name\n- x\n---\n",
    "unclosed and huge": b"---\nlicense: mit\n" + b"x: " + b"y" * (8 << 20) + b"\n",
    "not UTF-8": b"---\nname: \xff\xfe\n---\n",
    "alias bomb": b"---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  b"name: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n---\n",
}


@pytest.mark.parametrize("card", list(CARDS))
def test_a_hostile_model_card_falls_back_to_the_directory_name(card: str, tmp_path: Path) -> None:
    src = tmp_path / "tiny-llama-v2"
    src.mkdir()
    (src / "README.md").write_bytes(CARDS[card])
    (src / "config.json").write_text("{}")
    name = general_name(src, src.name)
    assert name == "Tiny Llama v2", name
    assert not (tmp_path / "HOSTILE").exists() and not Path("HOSTILE").exists()


def test_a_card_name_is_the_files_name(world: World) -> None:
    """End to end: the card's name lands in general.name; the store name does not."""
    from converters.gguf.verify import gguf_reader

    readme = world.src / "README.md"
    readme.write_text(readme.read_text().replace("---\n", "---\nname: Card Name\n", 1))
    _convert_unloaded(world, name="phi3-store-name")
    (path,) = (world.store / "models" / "phi3-store-name" / "versions" / "1" / "gguf").glob("*.gguf")
    reader = gguf_reader(path)
    assert bytes(reader.fields["general.name"].parts[-1]).decode() == "Card Name"
