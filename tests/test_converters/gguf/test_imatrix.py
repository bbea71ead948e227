"""Importance matrices and the IQ types against llama.cpp's own code: the matrix llama.cpp accumulates on the same
text, the bytes `llama_model_quantize` writes with it, the type mixes it chooses, and the conversions through the CLI.

llama.cpp's side runs two small programs built on the spot against its library (tests/support/llama_cpp_native.py).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cli import artifact, convert
from support.gguf_files import calibrated_llama, mreg_file, tensors

from converters.gguf import imatrix
from converters.gguf.mix import FILE_TYPES, MixParams, choose_types
from converters.gguf.plan import needs_imatrix, plans
from registry.digest import sha256_file

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the test extra")
gguf = pytest.importorskip("gguf")

#: Tokens per calibration chunk in these tests (the default, 512, would need a longer text per test).
CTX = 64


@pytest.fixture(scope="module")
def native(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two llama.cpp programs, compiled once (skipped only where the sdist is not named, as the other tests)."""
    from support.llama_cpp_native import build
    from support.llama_cpp_source import built_or_skip

    return built_or_skip(request, tmp_path_factory, "llama-cpp-native", lambda where: {
        name: build(name, where) for name in ("quantize_with_imatrix", "imatrix_by_eval_callback")})


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, native: dict[str, Path]) -> dict[str, Path]:
    """A bf16 llama (GQA 4), its F32 GGUF, a slice of the shipped calibration text, and the importance matrix of
    each side on it: mreg's (its float32 reference pass) and llama.cpp's (its own forward pass of the F32 file)."""
    from support.llama_cpp_native import imatrix as llama_imatrix

    root = tmp_path_factory.mktemp("imatrix")
    src, text, f32, ours = calibrated_llama(root, CTX)
    theirs = llama_imatrix(native["imatrix_by_eval_callback"], f32, text, CTX, root / "llama.imatrix.gguf")
    return {"src": src, "f32": f32, "text": text, "mreg": ours, "llama": theirs, "root": root}


@pytest.mark.slow
def test_mreg_imatrix_equals_llama_cpps_on_the_same_text(calibrated: dict[str, Path]) -> None:
    """Same matrices, same token counts, same chunking; sums equal to float tolerance (llama.cpp runs its KV
    cache in F16 and sums in float32, mreg's reference in float32 with float64 sums)."""
    ours, theirs = imatrix.read(calibrated["mreg"]), imatrix.read(calibrated["llama"])
    assert sorted(ours.sums) == sorted(theirs.sums)
    assert len(ours.sums) == 2 * 7  # q, k, v, output, gate, up, down of each layer
    assert (ours.chunk_count, ours.chunk_size) == (theirs.chunk_count, theirs.chunk_size)
    assert ours.chunk_count >= 2
    for name in ours.sums:
        assert np.array_equal(ours.counts[name], theirs.counts[name]), name
        np.testing.assert_allclose(ours.sums[name], theirs.sums[name], rtol=5e-3, atol=1e-6 * theirs.sums[name].max(),
                                   err_msg=name)


def test_the_file_is_llama_cpps_format(calibrated: dict[str, Path]) -> None:
    reader = gguf.GGUFReader(calibrated["mreg"])
    assert reader.fields["general.type"].contents() == "imatrix"
    assert reader.fields["imatrix.datasets"].contents() == ["calibration.txt"]
    assert reader.fields["imatrix.chunk_size"].contents() == CTX
    names = [t.name for t in reader.tensors]
    assert names == [n for base in sorted({n.rsplit(".", 1)[0] for n in names}) for n in (f"{base}.in_sum2",
                                                                                          f"{base}.counts")]
    def layout(r: Any) -> dict[str, tuple[str, list[int]]]:
        return {t.name: (t.tensor_type.name, [int(d) for d in t.shape]) for t in r.tensors}

    assert layout(reader) == layout(gguf.GGUFReader(calibrated["llama"]))


#: Every K-quant mix (mreg's kernels write their base types) and two IQ types (llama.cpp's encoder).
IMATRIX_FILE_TYPES = ["Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "Q2_K_S",
                      "IQ4_XS", "IQ2_M"]


@pytest.mark.parametrize("file_type", IMATRIX_FILE_TYPES)
@pytest.mark.slow
def test_bytes_equal_llama_quantize_with_the_same_imatrix(file_type: str, calibrated: dict[str, Path],
                                                           native: dict[str, Path], tmp_path: Path) -> None:
    from support.llama_cpp_native import quantize

    imp = imatrix.read(calibrated["mreg"])
    ours = tensors(mreg_file(calibrated["src"], file_type, tmp_path / "mreg.gguf", imp))
    theirs = tensors(quantize(native["quantize_with_imatrix"], calibrated["f32"], tmp_path / "llama.gguf",
                               FILE_TYPES[file_type][1], calibrated["mreg"]))
    assert {n: t for n, (t, _) in ours.items()} == {n: t for n, (t, _) in theirs.items()}
    assert [n for n in ours if ours[n][1] != theirs[n][1]] == []


def test_llama_imatrix_file_gives_llama_quantize_bytes(calibrated: dict[str, Path], native: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """The file llama.cpp wrote, read by mreg, weights the encoder as llama.cpp's quantize tool does."""
    from support.llama_cpp_native import quantize

    ours = tensors(mreg_file(calibrated["src"], "Q4_K_M", tmp_path / "m.gguf", imatrix.read(calibrated["llama"])))
    theirs = tensors(quantize(native["quantize_with_imatrix"], calibrated["f32"], tmp_path / "l.gguf",
                               FILE_TYPES["Q4_K_M"][1], calibrated["llama"]))
    assert ours == theirs


#: Every file type mreg adds with the importance matrices, with one (the rules of some change with it).
NEW_TYPES = ["Q2_K_S", "Q3_K_S", "Q3_K_L", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS",
             "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0"]


@pytest.fixture(scope="module", params=[4, 1], ids=["mha", "gqa4"])
def deep(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """16 layers (every layer rule: first/last eighth, every third, first sixteenth), with 4 or 1 KV heads (the
    GQA >= 4 rules), its F32 GGUF, and an importance matrix of ones for it (the choices do not depend on its
    values)."""
    from support.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("deep")
    src = build_tiny_llama(root / "src", vocab_size=320, hidden_size=256, intermediate_size=256, num_heads=4,
                           num_kv_heads=request.param, num_layers=16)
    f32 = mreg_file(src, "F32", root / "f32.gguf")
    (p,) = plans(src, sorted(src.glob("*.safetensors")), ["F32"], "tiny")
    ones = imatrix.Importance(datasets=["ones"], chunk_count=1, chunk_size=CTX)
    for t in p.model.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            ones.sums[t.name] = np.full((1, t.shape[1]), float(CTX), np.float32)
            ones.counts[t.name] = np.array([float(CTX)])
    imatrix.write(root / "ones.imatrix.gguf", ones)
    return {"f32": f32, "shapes": [(t.name, t.shape) for t in p.model.tensors], "imatrix": root / "ones.imatrix.gguf",
            "kv_heads": request.param}


@pytest.mark.parametrize("with_imatrix", [True, False], ids=["imatrix", "none"])
@pytest.mark.parametrize("file_type", NEW_TYPES)
@pytest.mark.slow
def test_mix_matches_llama_quantize(file_type: str, with_imatrix: bool, deep: dict[str, Any],
                                    native: dict[str, Path]) -> None:
    """llama_tensor_get_type's choice for every tensor (llama.cpp's --dry-run), with and without an importance
    matrix; without one, llama.cpp would refuse exactly the file types whose choices mreg marks as needing one."""
    from support.llama_cpp_native import dry_run

    ours = choose_types(file_type, deep["shapes"], MixParams(16, 4, deep["kv_heads"], has_imatrix=with_imatrix))
    theirs, refused = dry_run(native["quantize_with_imatrix"], deep["f32"], FILE_TYPES[file_type][1],
                              deep["imatrix"] if with_imatrix else None)
    assert {c.name: c.qtype for c in ours} == theirs
    assert refused == (not with_imatrix and any(c.needs_imatrix for c in ours))


def test_legacy_dat_is_read_as_llama_quantize_reads_it(tmp_path: Path) -> None:
    """`--output-format dat`: mean values times the chunk count, divided by it on reading."""
    values = np.array([2.0, 4.0, 6.0, 8.0], np.float32)
    name = b"blk.0.attn_q.weight"
    raw = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 4, 4) + values.tobytes()
    raw += struct.pack("<i", 4) + struct.pack("<i", 8) + b"wiki.txt"
    (tmp_path / "old.dat").write_bytes(raw)
    imp = imatrix.read(tmp_path / "old.dat")
    assert imp.legacy and imp.datasets == ["wiki.txt"] and imp.chunk_count == 4
    weights = imp.weights("blk.0.attn_q.weight")
    assert weights is not None
    np.testing.assert_array_equal(weights, values.reshape(1, 4) / 4)


def _outliers(src: Path) -> Path:
    """Give every layer's norms a few large columns, as trained models have (outlier features): the columns an
    importance matrix teaches the encoder to keep precise. Random weights alone give nearly uniform importance."""
    from support.tiny_models import set_value

    config = json.loads((src / "config.json").read_text())
    for i in range(config["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            for col in range(0, config["hidden_size"], 16):
                set_value(src, f"model.layers.{i}.{norm}.weight", col, 12.0)
    return src


@pytest.mark.slow
def test_calibration_default_is_recorded_keyed_and_lowers_kl(mreg: Any, store_root: Path,
                                                             tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """`--calibration default`: the importance matrix is a file of the version, its text's digest, tokens and
    chunking are in the manifest and the key (the same run is reused, another text is another version), and the
    file's KL divergence from the float32 reference is lower than without it (on a model with outlier features;
    measured here: see docs/benchmarks.md)."""
    src = _outliers(tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4,
                               num_layers=2, vocab_size=384))
    plain = convert(mreg, src, "gguf:Q3_K_S", name="plain")
    doc = mreg("convert", src, "--to", "gguf:Q3_K_S", "--calibration", "default", "--calibration-ctx", str(CTX),
               "--name", "cal", "--json")
    assert doc.exit_code == 0, doc.stderr
    art, tree = artifact(store_root, "cal", 1, "gguf")
    record = art["requirements"]["imatrix"]
    assert record["made_by"] == "mreg" and record["file"] == "cal.imatrix.gguf"
    assert record["dataset_sha256"] == sha256_file(imatrix.DEFAULT_CALIBRATION)
    assert record["tokens"] > 2 * CTX and record["chunks"] == record["tokens"] // CTX and record["chunk_size"] == CTX
    assert art["options"]["calibration"] == {"sha256": record["dataset_sha256"], "name": "calibration.txt",
                                             "chunk_size": CTX}
    assert {f["path"] for f in art["files"]} == {"cal-Q3_K_S.gguf", "cal.imatrix.gguf"}
    assert sha256_file(tree / "cal.imatrix.gguf") == record["sha256"]
    fields = gguf.GGUFReader(tree / "cal-Q3_K_S.gguf").fields
    assert fields["quantize.imatrix.file"].contents() == "cal.imatrix.gguf"
    assert art["verification"]["status"] == "passed"
    _, plain_tree = artifact(store_root, "plain", 1, "gguf")
    kl_with = art["verification"]["metrics"]["kl_divergence"]
    kl_without = json.loads((plain_tree.parent / "manifest.json").read_text())["artifacts"][0]["verification"][
        "metrics"]["kl_divergence"]
    assert kl_with < kl_without, (kl_with, kl_without)
    again = mreg("convert", src, "--to", "gguf:Q3_K_S", "--calibration", "default", "--calibration-ctx", str(CTX),
                 "--name", "cal", "--json")
    assert again.json["reused"] is True and again.json["version"] == 1
    other = tmp_path / "other.txt"
    other.write_text(imatrix.DEFAULT_CALIBRATION.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    third = mreg("convert", src, "--to", "gguf:Q3_K_S", "--calibration", other, "--calibration-ctx", str(CTX),
                 "--name", "cal", "--json")
    assert third.exit_code == 0, third.stderr
    assert third.json["reused"] is False and third.json["version"] == 2
    assert plain["key"] != doc.json["key"] != third.json["key"]


def _refused(result: Any, store_root: Path, name: str, *needles: str) -> dict[str, Any]:
    """A usage error (exit 2) as one JSON document with a hint, naming every needle; nothing published."""
    assert result.exit_code == 2, result.stderr + result.stdout
    err: dict[str, Any] = json.loads(result.stdout)["error"]
    assert err["exit_code"] == 2 and err["hint"]
    for needle in needles:
        assert needle in err["message"] + " " + err["hint"], (needle, err)
    assert not (store_root / "models" / name / "versions" / "1" / "manifest.json").exists(), "nothing published"
    return err


def test_iq2_without_an_imatrix_is_refused_with_the_next_step(mreg: Any, store_root: Path,
                                                              tiny_model: Callable[..., Path]) -> None:
    src = tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4, num_layers=2)
    result = mreg("convert", src, "--to", "gguf:IQ2_XXS", "--name", "iq2", "--json")
    _refused(result, store_root, "iq2", "needs an importance matrix", "--calibration")


def test_the_numpy_encoders_refuse_iq_types_naming_what_to_install(mreg: Any, store_root: Path,
                                                                   tiny_model: Callable[..., Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from converters.gguf import quants

    monkeypatch.setenv("MREG_GGUF_QUANTIZER", "numpy")
    quants._ggml_quantize_chunk.cache_clear()
    try:
        src = tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4, num_layers=2)
        result = mreg("convert", src, "--to", "gguf:IQ4_XS", "--name", "iq4", "--json")
        _refused(result, store_root, "iq4", "llama-cpp-python")
    finally:
        quants._ggml_quantize_chunk.cache_clear()


@pytest.mark.parametrize("args", [
    ("--calibration", "missing.txt"),
    ("--imatrix", "not-an-imatrix.gguf"),
    ("--calibration", "default", "--imatrix", "x.gguf"),
    ("--calibration", "default", "--calibration-ctx", "4"),
    ("--calibration-ctx", "64"),
    ("--calibration", "short.txt"),
])
def test_bad_importance_options_are_refused_before_any_work(args: tuple[str, ...], mreg: Any, store_root: Path,
                                                            tiny_model: Callable[..., Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not-an-imatrix.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    (tmp_path / "x.gguf").write_bytes(b"x")
    (tmp_path / "short.txt").write_text("Too short to make two chunks of 512 tokens.")
    src = tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4, num_layers=2)
    _refused(mreg("convert", src, "--to", "gguf:Q4_K_M", *args, "--name", "bad", "--json"), store_root, "bad")


def test_an_imatrix_of_another_model_is_refused(mreg: Any, store_root: Path, tiny_model: Callable[..., Path],
                                                tmp_path: Path) -> None:
    imp = imatrix.Importance(datasets=["x"], chunk_count=1, chunk_size=CTX)
    imp.sums["blk.0.attn_q.weight"] = np.ones((1, 128), np.float32)
    imp.counts["blk.0.attn_q.weight"] = np.ones(1)
    imatrix.write(tmp_path / "other.imatrix.gguf", imp)
    src = tiny_model("llama", hidden_size=256, intermediate_size=256, num_heads=4, num_kv_heads=4, num_layers=2)
    result = mreg("convert", src, "--to", "gguf:Q4_K_M", "--imatrix", tmp_path / "other.imatrix.gguf", "--name",
                  "other", "--json")
    _refused(result, store_root, "other", "another model")


@pytest.mark.parametrize("kind", ["qwen3moe"])
@pytest.mark.slow
def test_a_mixture_keeps_one_row_per_expert_and_quantizes_each_with_its_own(
        kind: str, tiny_model: Callable[..., Path], native: dict[str, Path], tmp_path: Path) -> None:
    """Stacked experts: in_sum2 and counts per expert (tokens routed to it), equal to llama.cpp's (MUL_MAT_ID);
    each expert's rows quantized with its own row, byte-equal to llama_model_quantize; and the eight-expert mix
    rules of every new file type (one model built for both: transformers builds it)."""
    from support.llama_cpp_native import imatrix as llama_imatrix
    from support.llama_cpp_native import quantize

    src = tiny_model(kind)
    text = tmp_path / "calibration.txt"
    text.write_text(imatrix.DEFAULT_CALIBRATION.read_text(encoding="utf-8")[:1500], encoding="utf-8")
    f32 = mreg_file(src, "F32", tmp_path / "f32.gguf")
    imatrix.compute(src, text, tmp_path / "mreg.imatrix.gguf", CTX, text.name)
    ours = imatrix.read(tmp_path / "mreg.imatrix.gguf")
    theirs = imatrix.read(llama_imatrix(native["imatrix_by_eval_callback"], f32, text, CTX, tmp_path / "l.gguf"))
    assert sorted(ours.sums) == sorted(theirs.sums)
    experts = [n for n in ours.sums if "_exps" in n]
    assert experts and all(ours.sums[n].shape[0] > 1 for n in experts)
    for name in ours.sums:
        assert np.array_equal(ours.counts[name], theirs.counts[name]), name
        np.testing.assert_allclose(ours.sums[name], theirs.sums[name], rtol=5e-3, atol=1e-6 * theirs.sums[name].max(),
                                   err_msg=name)
    mine = tensors(mreg_file(src, "Q4_K_M", tmp_path / "m.gguf", ours))
    llama = tensors(quantize(native["quantize_with_imatrix"], f32, tmp_path / "q.gguf", FILE_TYPES["Q4_K_M"][1],
                              tmp_path / "mreg.imatrix.gguf"))
    assert mine == llama
    _check_moe_mixes(src, f32, native, tmp_path)


def _check_moe_mixes(src: Path, f32: Path, native: dict[str, Path], tmp_path: Path) -> None:
    """The rules for eight experts (attn_v/attn_k Q8_0 or Q4_K, attn_output Q5_K, ffn_down by the layer in the
    name) for every new file type, with and without an importance matrix (one row per expert), as llama.cpp's."""
    from support.llama_cpp_native import dry_run

    (p,) = plans(src, sorted(src.glob("*.safetensors")), ["F32"], "tiny")
    ones = imatrix.Importance(datasets=["ones"], chunk_count=1, chunk_size=CTX)
    for t in p.model.tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:
            nmat = t.shape[0] if len(t.shape) == 3 else 1
            ones.sums[t.name] = np.full((nmat, t.shape[-1]), float(CTX), np.float32)
            ones.counts[t.name] = np.full(nmat, float(CTX))
    imatrix.write(tmp_path / "ones.imatrix.gguf", ones)
    m = p.model
    wrong = []
    for file_type in NEW_TYPES:
        for with_imatrix in (True, False):
            mix = MixParams(m.n_layer, m.n_head, m.n_head_kv, n_expert=8, has_imatrix=with_imatrix)
            ours = choose_types(file_type, [(t.name, t.shape) for t in m.tensors], mix)
            theirs, refused = dry_run(native["quantize_with_imatrix"], f32, FILE_TYPES[file_type][1],
                                      tmp_path / "ones.imatrix.gguf" if with_imatrix else None)
            if {c.name: c.qtype for c in ours} != theirs or refused != (
                    not with_imatrix and any(c.needs_imatrix for c in ours)):
                wrong.append((file_type, with_imatrix))
    assert wrong == []


@pytest.mark.slow
def test_an_imatrix_from_llama_imatrix_converts_iq2_m_that_llama_cpp_loads(mreg: Any, store_root: Path,
                                                                          calibrated: dict[str, Path]) -> None:
    """`--imatrix FILE`: the file is kept in the version as given, recorded as llama-imatrix's, and the IQ2_M file
    made with it passes verification (llama.cpp loads it; its logits are compared with the reference)."""
    result = mreg("convert", calibrated["src"], "--to", "gguf:IQ2_M", "--imatrix", calibrated["llama"], "--name",
                  "iq2m", "--json")
    assert result.exit_code == 0, result.stderr + result.stdout
    art, tree = artifact(store_root, "iq2m", 1, "gguf")
    record = art["requirements"]["imatrix"]
    assert record["made_by"] == "given" and record["chunk_size"] == CTX and record["tokens"] is None
    assert (tree / record["file"]).read_bytes() == calibrated["llama"].read_bytes()
    assert art["options"]["imatrix"]["sha256"] == record["sha256"] == sha256_file(calibrated["llama"])
    v = art["verification"]
    assert v["status"] == "passed" and v["metrics"]["llama_cpp_loaded"] == 1.0
    assert v["budget"] == {"kl_divergence": 0.6} and "kl_divergence" in v["metrics"]
    assert art["requirements"]["tensor_types"].get("IQ2_S", 0) > 0
    shown = mreg("show", "iq2m@1")
    assert shown.exit_code == 0 and f"imatrix: {record['file']} (given" in shown.stdout, shown.stdout


@pytest.mark.parametrize("damage", ["truncated", "random", "nan", "negative", "not-imatrix-type", "no-counts"])
def test_a_damaged_imatrix_is_one_line_and_exit_2(damage: str, tmp_path: Path) -> None:
    """Hostile importance matrices (a truncated or random file, NaN or negative sums, a GGUF of another kind,
    sums without counts) are refused with one InvalidImportance, never a traceback."""
    imp = imatrix.Importance(datasets=["x"], chunk_count=2, chunk_size=CTX)
    imp.sums["blk.0.attn_q.weight"] = np.ones((1, 256), np.float32)
    imp.counts["blk.0.attn_q.weight"] = np.full(1, 2.0)
    path = tmp_path / "bad.imatrix.gguf"
    if damage == "nan":
        imp.sums["blk.0.attn_q.weight"][0, 3] = np.nan
    if damage == "negative":
        imp.sums["blk.0.attn_q.weight"][0, 3] = -1.0
    imatrix.write(path, imp)
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "random":
        path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif damage == "not-imatrix-type":
        seven = struct.pack("<Q", 7)  # general.type's value: a string of 7 bytes
        path.write_bytes(raw.replace(seven + b"imatrix", seven + b"imatrax", 1))
    elif damage == "no-counts":
        path.write_bytes(raw.replace(b".counts", b".countz"))
    with pytest.raises(imatrix.InvalidImportance) as caught:
        imatrix.read(path)
    assert caught.value.exit_code == 2 and caught.value.hint and "\n" not in str(caught.value)


def _imatrix_peak_rss_mb(src: Path, text: Path, out: Path) -> float:
    import os
    import subprocess
    import sys

    code = (f"import resource\nfrom pathlib import Path\nfrom converters.gguf.imatrix import _child\n"
            f"doc = _child(Path({str(src)!r}), Path({str(text)!r}), Path({str(out)!r}), 16, 'x')\n"
            f"assert 'error' not in doc, doc\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_computing_an_imatrix_keeps_memory_flat(tmp_path: Path) -> None:
    """The forward pass streams each matrix a block of rows at a time: 5x the weights, about the same peak."""
    from support.tiny_models import build_padded_model

    text = tmp_path / "text.txt"
    text.write_text(imatrix.DEFAULT_CALIBRATION.read_text(encoding="utf-8")[:400], encoding="utf-8")
    small = build_padded_model(tmp_path / "small", 40 * 10**6, shard_bytes=20 * 10**6)
    large = build_padded_model(tmp_path / "large", 200 * 10**6, shard_bytes=100 * 10**6)
    rss_small = _imatrix_peak_rss_mb(small, text, tmp_path / "small.imatrix.gguf")
    rss_large = _imatrix_peak_rss_mb(large, text, tmp_path / "large.imatrix.gguf")
    assert rss_large - rss_small < 40, f"peak RSS {rss_small:.0f} MB -> {rss_large:.0f} MB for 5x the weights"


@pytest.mark.parametrize("width", [256, 64])
def test_config_alone_refuses_exactly_what_the_full_plan_refuses(width: int, tiny_model: Callable[..., Path]) -> None:
    """The check made before a hub download (config.json alone) names a tensor for a file type exactly when the
    plan made from the weights does (64 wide: rows fall back to types that need no matrix, so neither refuses)."""
    src = tiny_model("llama", hidden_size=width, intermediate_size=width, num_heads=4, num_kv_heads=1, num_layers=2)
    config = json.loads((src / "config.json").read_text())
    types = list(FILE_TYPES)
    planned = plans(src, sorted(src.glob("*.safetensors")), types, "m")
    for file_type, p in zip(types, planned, strict=True):
        full = any(c.needs_imatrix for c in p.choices)
        assert (needs_imatrix(config, file_type) is not None) == full, (width, file_type)
    assert width != 256 or needs_imatrix(config, "IQ2_M") is not None
