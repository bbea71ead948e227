"""A GGUF converted where llama.cpp is not installed (a plain `pip install mreg`): its record must not claim the
checks llama.cpp runs. The status is `structural`, the method names only what ran, `convert` and `show` say "not
loaded by llama.cpp", and `promote --require loaded` refuses the version.

The runtime is made absent as an uninstalled package is: `import llama_cpp` raises and its spec is not found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.absent import without_llama_cpp
from support.cli import artifact, convert

pytest.importorskip("gguf")

NOT_LOADED = "not loaded by llama.cpp"


@pytest.fixture
def no_llama_cpp() -> Iterator[None]:
    """llama-cpp-python as if not installed (find_spec gives None, the import raises)."""
    with without_llama_cpp():
        yield


@pytest.mark.parametrize("spec", ["F16", "Q8_0"])
def test_a_file_llama_cpp_never_loaded_is_structural(spec: str, no_llama_cpp: None, mreg: Any, store_root: Path,
                                                    tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("llama")
    doc = convert(mreg, src, f"gguf:{spec}")
    assert doc["verification"] == {"gguf": "structural"}
    assert doc["not_run"]["gguf"][0].startswith(NOT_LOADED)
    v = artifact(store_root, "m", 1, "gguf")[0]["verification"]
    assert v["status"] == "structural" and v["not_run"][0].startswith(NOT_LOADED)
    # The method names what ran (the reader's checks and the encoding error), nothing of llama.cpp's.
    assert "gguf reader" in v["method"] and not any(w in v["method"] for w in ("llama.cpp", "tokeniz", "logits"))
    assert "llama_cpp_loaded" not in v["metrics"] and "tokenization_mismatches" not in v["tolerance"]
    assert not any(k.startswith(("logits", "kl_")) for k in v["tolerance"])


def test_convert_and_show_say_it_in_plain_words_and_the_gate_refuses(no_llama_cpp: None, mreg: Any,
                                                                     tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("llama")
    r = mreg("convert", src, "--to", "gguf:F16", "--name", "m")
    assert r.exit_code == 0, r.stderr
    assert "verification gguf structural" in r.stdout and NOT_LOADED in r.stdout
    shown = mreg("show", "m@1")
    assert shown.exit_code == 0 and "verification structural" in shown.stdout and NOT_LOADED in shown.stdout
    refused = mreg("promote", "m@1", "--require", "loaded", "--json")
    assert refused.exit_code == 6, refused.stderr
    assert "never loaded" in refused.stderr and NOT_LOADED in refused.stderr
    assert mreg("resolve", "m@production").exit_code != 0, "the refused promotion changed nothing"
    scoped = mreg("promote", "m@1", "--require", "gguf:loaded", "--json")
    assert scoped.exit_code == 6 and "never loaded by llama.cpp" in scoped.stderr, scoped.stderr
    # Presence alone (--require gguf) and the default gates still let it through: structural is not failed.
    assert mreg("promote", "m@1", "--require", "gguf", "--json").exit_code == 0


def test_a_loaded_file_passes_the_gate(mreg: Any, tiny_model: Callable[..., Path]) -> None:
    pytest.importorskip("llama_cpp")
    doc = convert(mreg, tiny_model("llama"), "gguf:F16")
    assert doc["verification"] == {"gguf": "passed"} and "gguf" not in doc["not_run"]
    for requirement in ("loaded", "gguf:loaded"):
        assert mreg("promote", "m@1", "--require", requirement, "--json").exit_code == 0
