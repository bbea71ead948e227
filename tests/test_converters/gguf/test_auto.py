"""`--to gguf:auto`: the smallest type meeting a budget on the evaluation text, every candidate recorded, the chart.

The tiny model's rows divide into 256-blocks, so every candidate is its own mix (no fallbacks). A first run
with a budget nothing meets (exit 6, nothing published) measures the largest candidates; the second run's
budget sits between two of them, so its answer is known before it runs.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, ok

from converters.gguf.auto import CANDIDATES, WEIGHTED_CANDIDATES, bisect, size_order

pytest.importorskip("llama_cpp")

SVG = "{http://www.w3.org/2000/svg}"
SHAPE = {"hidden_size": 256, "intermediate_size": 256, "num_heads": 4, "num_kv_heads": 1, "num_layers": 2}


def test_bisection_finds_the_smallest_that_meets_in_few_tries() -> None:
    for first in range(10):  # positions >= first meet
        found, tried = bisect(9, lambda pos, first=first: pos >= first)
        assert found == (first if first < 9 else None)
        assert len(tried) <= 4 and len(set(tried)) == len(tried)
    assert size_order([30, 10, 20, 10]) == [3, 1, 2, 0]  # equal sizes: the later (nominally smaller) type first


@pytest.mark.slow
def test_auto_picks_the_type_whose_kl_is_just_within_the_budget(mreg: Any, tiny_model: Callable[..., Path],
                                                                store_root: Path) -> None:
    src = tiny_model("llama", **SHAPE)
    common = ["--to", "gguf:auto", "--eval-tokens", "48", "--name", "m", "--json"]
    refused = mreg("convert", src, *common, "--budget", "kl=1e-12")
    assert refused.exit_code == 6, refused.stderr
    error = refused.json["error"]
    assert "no candidate meets kl_divergence <= 1e-12" in error["message"] and "the best tried" in error["message"]
    assert not (store_root / "models" / "m" / "versions").exists() or not any(
        (store_root / "models" / "m" / "versions").iterdir())
    cands = error["details"]["candidates"]
    assert [c["type"] for c in cands] == list(CANDIDATES)
    by_size = sorted(cands, key=lambda c: c["tensor_bytes"])
    tried = [c for c in by_size if c["tried"]]
    assert 2 <= len(tried) <= 4 and tried[-1] is by_size[-1]  # bisection climbs to the largest
    # A budget between two measured KLs whose whole search visits only measured candidates has a known answer:
    # the smallest such answer below the largest type (Q8_0 not needed), found by running the same bisection.
    kls = {i: c["metrics"]["kl_divergence"] for i, c in enumerate(by_size) if c["tried"]}
    known = []
    for a, b in zip(sorted(kls.values()), sorted(kls.values())[1:], strict=False):
        budget = math.sqrt(a * b)
        visited: list[int] = []

        def meets(pos: int, budget: float = budget, visited: list[int] = visited) -> bool:
            visited.append(pos)
            return kls.get(pos, math.inf) <= budget

        found, _ = bisect(len(by_size), meets)
        if found is not None and all(v in kls for v in visited):
            known.append((found, budget, len(visited)))
    found, budget, steps = min(known)
    large = by_size[found]

    doc = ok(mreg("convert", src, *common, "--budget", f"kl={budget:.6g}"))
    again = ok(mreg("convert", src, *common, "--budget", f"kl={budget:.6g}"))
    assert again["reused"] and again["version"] == doc["version"], "same text, budget and candidates: same key"
    art, tree = artifact(store_root, "m", doc["version"], "gguf")
    sel = art["requirements"]["selection"]
    assert sel["chosen"] == large["type"] and art["requirements"]["quantization"] == large["type"]
    assert sel["search"] == "bisection" and sel["tried"] == sum(c["tried"] for c in sel["candidates"]) == steps
    assert sel["budget"] == {"kl_divergence": float(f"{budget:.6g}")}
    assert art["verification"]["budget"] == sel["budget"]
    # Losers are discarded (their figures kept): the chosen file and the chart, nothing else.
    assert sorted(f["path"] for f in art["files"]) == ["auto.svg", f"m-{large['type']}.gguf"]
    chosen = next(c for c in sel["candidates"] if c["type"] == large["type"])
    assert chosen["meets"] and chosen["file_bytes"] == next(f["size"] for f in art["files"]
                                                            if f["path"].endswith(".gguf"))
    assert all(c["meets"] is False for c in sel["candidates"] if c["tried"] and c["type"] != large["type"])
    # Quality on the evaluation text: its digest is an option (part of the key), its token count a metric.
    assert art["options"]["evaluation"]["text"] == "default" and len(art["options"]["evaluation"]["sha256"]) == 64
    assert art["verification"]["metrics"]["evaluation_tokens"] == 48
    assert any("evaluation text default (sha256:" in i for i in art["verification"]["inputs"])
    assert art["weights_bytes"] == chosen["tensor_bytes"]

    root = ET.parse(tree / "auto.svg").getroot()
    assert root.tag == f"{SVG}svg"
    points = root.findall(f".//{SVG}g[@class='candidate']")
    assert [g.get("data-type") for g in points] == list(CANDIDATES)
    assert all(g.findall(f"{SVG}circle") for g in points)
    assert len(root.findall(f".//{SVG}circle[@class='chosen']")) >= 1
    assert root.findall(f".//{SVG}line[@class='budget']")

    human = mreg("show", "m@1")
    assert f"auto: {large['type']}, the smallest of {len(CANDIDATES)} candidates" in human.stdout
    assert "chart: " in human.stdout and human.stdout.rstrip().count("auto.svg") >= 1
    assert json.loads(mreg("show", "m@1", "--json").stdout)["manifest"]["artifacts"][0]["requirements"]["selection"]


def test_auto_refusals_before_any_work(mreg: Any, tiny_model: Callable[..., Path], store_root: Path,
                                       tmp_path: Path) -> None:
    src = tiny_model("llama")
    for args, needle in (
        (["--to", "gguf:Q8_0", "--budget", "kl=0.1"], "goes with gguf:auto"),
        (["--to", "gguf:auto", "--budget", "kl=lots"], "cannot read 'kl=lots'"),
        (["--to", "gguf:auto", "--evaluation", str(tmp_path / "absent.txt")], "no such file"),
        (["--to", "hf", "--budget", "kl=0.1"], "go with --to gguf"),
        (["--to", "gguf:auto", "--eval-tokens", "1"], "not a number of tokens"),
    ):
        r = mreg("convert", src, *args, "--name", "m", "--json")
        assert r.exit_code == 2 and needle in r.json["error"]["message"], (args, r.stdout)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00" * 10)
    r = mreg("convert", src, "--to", "gguf:auto", "--evaluation", binary, "--name", "m", "--json")
    assert r.exit_code == 2 and "not UTF-8" in r.json["error"]["message"]
    r = mreg("convert", src, "--to", "gguf:auto", "--to", "gguf:F16", "--name", "m", "--json")
    assert r.exit_code == 2 and "gguf:auto goes alone" in r.json["error"]["message"]
    assert not any((store_root / "models" / "m" / "versions").glob("*"))


def test_an_evaluation_text_of_ones_own_for_a_named_type(mreg: Any, tiny_model: Callable[..., Path],
                                                         store_root: Path, tmp_path: Path) -> None:
    text = tmp_path / "eval.txt"
    text.write_text("A model registry keeps every version of a model, and the numbers that say how good it is. " * 8)
    doc = ok(mreg("convert", tiny_model("llama"), "--to", "gguf:Q8_0", "--evaluation", text, "--eval-tokens", "40",
                  "--name", "m", "--json"))
    art, _ = artifact(store_root, "m", doc["version"], "gguf")
    ev = art["options"]["evaluation"]
    assert ev["text"] == "eval.txt" and ev["max_tokens"] == 40
    metrics = art["verification"]["metrics"]
    assert metrics["evaluation_tokens"] == 40 == metrics["logits_positions"] and "perplexity_ratio" in metrics


@pytest.mark.slow
def test_auto_with_an_importance_matrix_chooses_among_the_iq_types_too(mreg: Any, tiny_model: Callable[..., Path],
                                                                     store_root: Path) -> None:
    """With --calibration the matrix is made once, every candidate is quantized with it, and the 1- and 2-bit
    IQ types are candidates: a budget everything meets takes the smallest file, an IQ type only a matrix allows."""
    src = tiny_model("llama", **SHAPE)
    doc = ok(mreg("convert", src, "--to", "gguf:auto", "--budget", "kl=1e9", "--calibration", "default",
                  "--calibration-ctx", "64", "--eval-tokens", "32", "--name", "m", "--json"))
    art, tree = artifact(store_root, "m", doc["version"], "gguf")
    sel = art["requirements"]["selection"]
    assert [c["type"] for c in sel["candidates"]] == list(WEIGHTED_CANDIDATES) == art["options"]["candidates"]
    smallest = min(sel["candidates"], key=lambda c: c["tensor_bytes"])
    assert sel["chosen"] == smallest["type"] and smallest["type"].startswith("IQ1")
    assert 1 < sel["tried"] <= 5 and smallest["meets"]
    imp = art["requirements"]["imatrix"]
    assert imp["made_by"] == "mreg" and imp["chunk_size"] == 64 and art["options"]["calibration"]["chunk_size"] == 64
    files = sorted(f["path"] for f in art["files"])
    assert files == sorted(["auto.svg", f"m-{smallest['type']}.gguf", "m.imatrix.gguf"])
    from converters.gguf.verify import gguf_reader

    reader = gguf_reader(tree / f"m-{smallest['type']}.gguf")
    assert reader.fields["quantize.imatrix.file"].contents() == "m.imatrix.gguf"
    # Without a matrix: the types llama.cpp writes without one, IQ4_XS and IQ3_S/IQ3_M among them.
    plain = mreg("convert", src, "--to", "gguf:auto", "--budget", "kl=1e-12", "--eval-tokens", "32", "--name", "p",
                 "--json")
    assert plain.exit_code == 6
    assert [c["type"] for c in plain.json["error"]["details"]["candidates"]] == list(CANDIDATES)
    assert {"IQ4_XS", "IQ3_M", "IQ3_S"} <= set(CANDIDATES) and not {"IQ2_M", "IQ1_S"} & set(CANDIDATES)
