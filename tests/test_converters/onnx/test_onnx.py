"""`mreg convert --to onnx`: the spec grammar, clear refusals, and encoders verified in ONNX Runtime.

The heavy tests build a tiny BERT, convert it through the CLI and load the published tree with ONNX
Runtime; a tampered export (a scaled or NaN weight) must fail verification and publish nothing.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

from converters.onnx.converter import CONVERTER, GRAMMAR, parse_spec
from registry.errors import UsageError

HEAVY = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")


def _have_heavy() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in HEAVY)


needs_onnx = pytest.mark.skipif(not _have_heavy(), reason="needs mreg[onnx] (torch, transformers, onnx, onnxruntime)")


# --------------------------------------------------------------------------- spec grammar, no heavy imports


def _opts(**changes: Any) -> dict[str, Any]:
    return {"dtype": "fp32", "quantize": None, "optimize": False, "with_past": False, "exporter": "torchscript",
            **changes}


@pytest.mark.parametrize(("spec", "expected"), [
    ("", _opts()),
    ("fp16", _opts(dtype="fp16")),
    ("with-past, FP16", _opts(dtype="fp16", with_past=True)),
    ("int8,optimize", _opts(quantize="int8", optimize=True)),
    ("fp32,optimize,with-past", _opts(optimize=True, with_past=True)),
    ("dynamo,with-past", _opts(with_past=True, exporter="dynamo")),
])
def test_spec_normalizes(spec: str, expected: dict[str, Any]) -> None:
    assert parse_spec(spec) == expected
    assert CONVERTER.options({"spec": spec} if spec else {}) == expected


def test_spec_order_does_not_change_the_options() -> None:
    assert CONVERTER.options({"spec": "with-past,fp16"}) == CONVERTER.options({"spec": "fp16,with-past"})


@pytest.mark.parametrize(("spec", "message"), [
    ("bf16", "unknown --to onnx option 'bf16'"),
    ("fp16,fp32", "sets dtype twice"),
    ("fp16,int8", "cannot be combined with fp16"),
    ("optimize,optimize", "sets optimize twice"),
    ("dynamo,torchscript", "sets exporter twice"),
])
def test_spec_refusals_name_the_grammar(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_spec(spec)
    assert info.value.hint == GRAMMAR and info.value.exit_code == 2


def test_options_refuse_unknown_keys() -> None:
    with pytest.raises(UsageError, match="takes only a spec"):
        CONVERTER.options({"dtype": "fp16"})


@needs_onnx
@pytest.mark.slow
def test_the_process_ends_without_tearing_torch_down(bert: Path, tmp_path: Path) -> None:
    """After torch was imported, `mreg` ends with os._exit: exit code, buffered output and exit handlers intact."""
    env = {**os.environ, "MREG_STORE": str(tmp_path / "store"), "MREG_CACHE_DIR": str(tmp_path / "cache")}
    mreg_bin = str(Path(sys.executable).parent / "mreg")
    done = subprocess.run([mreg_bin, "convert", bert, "--to", "onnx", "--name", "m", "--json"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verification"] == {"onnx": "passed"}, "the whole document reached the pipe"
    # An error after torch was imported keeps its exit code; atexit handlers still run; module teardown does not.
    marker = tmp_path / "atexit-ran"
    code = ("import atexit, pathlib, sys, torch; "
            f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes'); "
            "Teardown = type('Teardown', (), {'__del__': lambda self: print('torn down', file=sys.stderr)}); "
            "sentinel = Teardown(); "
            "sys.argv = ['mreg', 'resolve', 'nosuch@production', '--json']; "
            "from registry.cli import run; run()")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 3 and json.loads(done.stdout)["error"]["type"] == "ModelNotFound", done.stderr
    assert marker.read_text() == "yes" and "torn down" not in done.stderr


def test_planning_imports_no_heavy_library() -> None:
    code = ("import sys; from registry.convert import formats; c = formats.get('onnx'); c.options({'spec': 'fp16'}); "
            "c.tool_versions(); "
            "from registry.cli import main; "
            f"print([m for m in {(*HEAVY, 'numpy')!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[3])
    assert out.stdout.strip() == "[]", out.stdout


def test_tool_versions_accept_the_gpu_build_of_onnx_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def version(dist: str) -> str:
        if dist == "onnxruntime":
            raise metadata.PackageNotFoundError(dist)
        return "1.31.1" if dist == "onnxruntime-gpu" else "9.9"

    monkeypatch.setattr(metadata, "version", version)
    tools = CONVERTER.tool_versions()
    assert tools["onnxruntime"] == "1.31.1 (onnxruntime-gpu)" and tools["torch"] == "9.9"
    assert tools["onnx.opset"] == "18" and tools["onnx.ir_version"] == "10"

    monkeypatch.setattr(metadata, "version", lambda d: (_ for _ in ()).throw(metadata.PackageNotFoundError(d)))
    with pytest.raises(UsageError, match="needs torch, transformers, onnx, onnxruntime, onnxscript, numpy") as info:
        CONVERTER.tool_versions()
    assert info.value.hint == "pip install 'mreg[onnx]'"


def test_missing_library_says_how_to_install(mreg: Any, tmp_path: Path, store_root: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from support.tiny_models import build_tiny_bert

    src = build_tiny_bert(tmp_path / "bert")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    r = mreg("convert", src, "--to", "onnx", "--name", "m")
    assert r.exit_code == 2, r.stderr
    assert "not installed" in r.stderr and "pip install 'mreg[onnx]'" in r.stderr
    assert not (store_root / "models" / "m" / "versions").exists()


def test_unsupported_model_is_refused(mreg: Any, tmp_path: Path, store_root: Path) -> None:
    from conftest import write_model

    src = write_model(tmp_path / "gpt", 1)
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    r = mreg("convert", src, "--to", "onnx", "--name", "m", "--json")
    assert r.exit_code == 2 and r.json["error"]["type"] == "UnsupportedModel"
    assert "'gpt2' is not supported" in r.json["error"]["message"] and "llama" in r.json["error"]["hint"]


# --------------------------------------------------------------------------- encoders through the CLI


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    """A tiny BERT directory (WordPiece tokenizer, token_type_ids)."""
    from support.tiny_models import build_tiny_bert

    return build_tiny_bert(tmp_path / "tiny-bert")


@needs_onnx
@pytest.mark.slow
def test_encoder_exports_verifies_and_is_reused(mreg: Any, bert: Path, store_root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from converters.onnx import export

    # config.json travels in the request (read once per convert): the converter does not read it again.
    monkeypatch.setattr(export, "read_config", lambda directory: pytest.fail(f"{directory}/config.json read again"))
    threshold = gc.get_threshold()
    doc = convert(mreg, bert, "onnx")
    assert doc["verification"] == {"onnx": "passed"} and doc["reused"] is False
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0, "the collector is as it was"
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    paths = {f["path"] for f in art["files"]}
    assert {"model.onnx", "model.onnx.data", "config.json", "tokenizer.json", "vocab.txt"} <= paths
    assert art["options"] == _opts()
    tools = art["tool_versions"]
    assert {"torch", "transformers", "onnx", "onnxruntime", "onnxscript"} <= set(tools)
    assert tools["onnxruntime.provider"] == "CPUExecutionProvider"
    assert tools["onnx.opset"] == "18" and tools["onnx.ir_version"] == "10" and tools["onnx.opsets"] == "ai.onnx=18"
    v = art["verification"]
    assert v["status"] == "passed" and len(v["inputs"]) == 3
    assert any("left-padded" in i for i in v["inputs"]) and any(i.startswith("batch 3") for i in v["inputs"])
    m = v["metrics"]
    assert m["last_hidden_state.max_abs_diff"] <= 1e-4 < v["tolerance"]["last_hidden_state.max_abs_diff"] == \
        pytest.approx(1e-4 + 1e-5 * m["last_hidden_state.reference_max_abs"])
    assert m["last_hidden_state.nonfinite"] == 0.0 and m["last_hidden_state.min_cosine"] > 0.9999
    assert 0 <= m["last_hidden_state.max_rel_diff"] < 1e-4

    # What an engine mounts: ORT loads the published tree as it is, with any batch and length.
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False)
    assert graph.ir_version == 10 and [(o.domain, o.version) for o in graph.opset_import] == [("", 18)]
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer)
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert dims == {n: ["batch", "sequence"] for n in ("input_ids", "attention_mask", "token_type_ids")}
    sess = ort.InferenceSession(str(tree / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.full((4, 9), 7, dtype=np.int64)
    (out,) = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0})
    assert out.shape == (4, 9, 32) and np.isfinite(out).all()

    again = convert(mreg, bert, "onnx")
    assert again["reused"] is True and again["version"] == doc["version"], "same inputs and options: no new work"
    fp16 = convert(mreg, bert, "onnx:fp16")
    assert fp16["version"] == doc["version"] + 1 and fp16["key"] != doc["key"], "an option is part of the key"
    art16, tree16 = artifact(store_root, "m", fp16["version"], "onnx")
    assert art16["options"]["dtype"] == "fp16" and art16["verification"]["status"] == "passed"
    m16, tol16 = art16["verification"]["metrics"], art16["verification"]["tolerance"]
    assert m16["last_hidden_state.min_cosine"] >= tol16["last_hidden_state.min_cosine"] == 0.999
    assert "last_hidden_state.max_abs_diff" not in tol16, "fp16 is judged by cosine, not by the fp32 bound"
    # onnx >= 1.23 refuses to read external data through a file with several hard links, which is what
    # every store blob is: the graph is read here without its weights, ORT reads both (above).
    graph16 = onnx.load(str(tree16 / "model.onnx"), load_external_data=False)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph16.graph.initializer)
    assert graph16.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT, "outputs stay float32"
    gc.freeze()  # a host process that froze its own objects keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        assert convert(mreg, bert, "onnx:optimize")["verification"] == {"onnx": "passed"}
        # (frozen objects can still be freed by reference counting: the count may only drop, not to 0)
        assert 0 < gc.get_freeze_count() <= frozen and gc.get_threshold() == threshold
    finally:
        gc.unfreeze()


@needs_onnx
def test_int8_with_offline_optimization(mreg: Any, bert: Path, store_root: Path) -> None:
    import logging
    import sys

    import onnx

    root = logging.getLogger()
    handlers, level, stdout = list(root.handlers), root.level, sys.stdout
    root.handlers.clear()  # a host that configured no logging (pytest's handlers are put back below)
    try:
        doc = convert(mreg, bert, "onnx:optimize,int8")
        # onnxruntime's quantizer logs through the root logger (`logging.warning`, which would run basicConfig):
        # the host's logging and stdout are as they were.
        assert root.handlers == [] and root.level == level and sys.stdout is stdout
    finally:
        root.handlers[:] = handlers
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    assert art["options"] == _opts(quantize="int8", optimize=True)
    v = art["verification"]
    assert v["status"] == "passed" and "int8 thresholds" in v["method"]
    assert v["tolerance"]["last_hidden_state.mean_cosine"] == 0.98
    assert v["metrics"]["last_hidden_state.mean_cosine"] >= 0.98
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}, ops
    assert "com.microsoft" in art["tool_versions"]["onnx.opsets"], "ORT fusions are recorded through the opsets"
    assert graph.ir_version == 10


def _tamper(monkeypatch: pytest.MonkeyPatch, how: Callable[[Any], None]) -> None:
    """Make the exporter write a model whose largest MatMul weight (a feed-forward one) is changed by `how`."""
    from onnx import numpy_helper

    from converters.onnx import export as onnx_export
    from converters.onnx.graph import load_proto

    real = onnx_export.export

    def tampered(model: Any, sig: Any, dest: Path, exporter: Any) -> None:
        real(model, sig, dest, exporter)
        proto = load_proto(dest)
        inits = {t.name: t for t in proto.graph.initializer}
        weights = {i: numpy_helper.to_array(inits[i]) for n in proto.graph.node if n.op_type == "MatMul"
                   for i in n.input if i in inits}
        name = max(weights, key=lambda i: weights[i].size)
        array = weights[name].copy()
        how(array)
        inits[name].CopyFrom(numpy_helper.from_array(array, name))
        onnx_export.save(proto, dest)

    monkeypatch.setattr(onnx_export, "export", tampered)


@needs_onnx
@pytest.mark.parametrize(("label", "how", "message"), [
    ("scaled by 1%", lambda a: a.__imul__(1.01), "last_hidden_state.max_abs_diff = "),
    ("one NaN", lambda a: a.flat.__setitem__(0, float("nan")), "last_hidden_state has "),
])
def test_a_tampered_export_fails_and_publishes_nothing(label: str, how: Callable[[Any], None], message: str,
                                                       mreg: Any, bert: Path, store_root: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _tamper(monkeypatch, how)
    r = mreg("convert", bert, "--to", "onnx", "--name", "m", "--json")
    assert r.exit_code == 4, f"{label}: {r.stdout}"
    err = r.json["error"]
    assert err["type"] == "IntegrityError" and "failed verification" in err["message"] and message in err["message"]
    strict = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))  # jq must read it
    record = strict["error"]["details"]["verification"]  # the metrics against their tolerances, for CI logs
    assert err["details"]["format"] == "onnx" and record["status"] == "failed"
    metrics, tolerance = record["metrics"], record["tolerance"]
    assert metrics["last_hidden_state.nonfinite"] > 0 or \
        metrics["last_hidden_state.max_abs_diff"] > tolerance["last_hidden_state.max_abs_diff"]
    assert not (store_root / "models" / "m" / "versions").exists() or \
        not any((store_root / "models" / "m" / "versions").iterdir())
    leftovers = [p for p in (store_root / "tmp").rglob("*") if p.is_file()] if (store_root / "tmp").exists() else []
    assert leftovers == [], "staging is discarded"


@needs_onnx
def test_nan_and_inf_weights_no_probe_reaches_fail_and_publish_nothing(mreg: Any, bert: Path,
                                                                      store_root: Path) -> None:
    """The last position embedding (probes are at most 48 tokens of 64) and the second token type (probes are single
    sentences) never reach an output: only reading the weights finds them."""
    from support.cli import integrity_refusal
    from support.tiny_models import set_value

    set_value(bert, "embeddings.position_embeddings.weight", 63 * 32 + 1, float("nan"))
    set_value(bert, "embeddings.token_type_embeddings.weight", 1 * 32 + 5, float("-inf"))
    r = mreg("convert", bert, "--to", "onnx", "--name", "m", "--json")
    err = integrity_refusal(r, store_root, "m", "source tensor embeddings.position_embeddings.weight has 1 NaN/Inf",
                            "source tensor embeddings.token_type_embeddings.weight has 1 NaN/Inf",
                            "written initializer model.embeddings.position_embeddings.weight has 1 NaN/Inf")
    metrics = err["details"]["verification"]["metrics"]
    assert metrics["last_hidden_state.nonfinite"] == 0.0, "ONNX Runtime's outputs alone would have passed"
    assert metrics["weights.source_tensor_nonfinite"] == 2.0


def test_pytorch_nan_on_real_tokens_fails_and_on_padding_does_not() -> None:
    """A fully masked row can be NaN in a correct model's attention: only real tokens are judged."""
    np = pytest.importorskip("numpy")
    from converters.onnx.verify import THRESHOLDS, compare, judge

    ref = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    padded = ref.copy()
    padded[1, 0] = np.nan
    real = ref.copy()
    real[0, 4] = np.nan
    for precision in THRESHOLDS:
        assert judge(compare("logits", ref.copy(), padded, mask), THRESHOLDS[precision])[0] == []
        problems, tolerance = judge(compare("logits", ref.copy(), real, mask), THRESHOLDS[precision])
        assert "PyTorch's logits has 8 NaN/Inf values on real tokens" in problems
        assert tolerance["logits.reference_nonfinite"] == 0.0


def test_the_worst_case_across_batches_keeps_nan() -> None:
    from converters.onnx.verify import _merge

    for first, second in ((1e-5, float("nan")), (float("nan"), 1e-5)):
        merged: dict[str, float] = {"logits.max_abs_diff": first, "logits.min_cosine": first}
        _merge(merged, {"logits.max_abs_diff": second, "logits.min_cosine": second})
        assert all(math.isnan(v) for v in merged.values()), (first, second)


def test_fp32_bound_scales_with_real_logit_magnitudes() -> None:
    """Logits that reach tens, off by fp32 rounding of another summation order, pass; a wrong value fails."""
    np = pytest.importorskip("numpy")
    from converters.onnx.verify import THRESHOLDS, compare, judge

    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((2, 7, 500)) * 9.0).astype(np.float32)  # max |logit| about 35, as real ones
    mask = np.ones((2, 7), dtype=np.int64)
    rounded = ref * np.float32(1 + 4e-6)  # ~1.4e-4 at the largest logits: the SmolLM2/Qwen2.5 exports' 1.3e-4
    metrics = compare("logits", rounded, ref, mask)
    assert metrics["logits.max_abs_diff"] > 1e-4, "beyond the old absolute bound"
    problems, tolerance = judge(metrics, THRESHOLDS["fp32"])
    assert problems == [] and 1e-4 < tolerance["logits.max_abs_diff"] < 1e-3
    wrong = ref.copy()
    wrong[1, 3, 42] += 0.01
    problems, _ = judge(compare("logits", wrong, ref, mask), THRESHOLDS["fp32"])
    assert problems and "logits.max_abs_diff" in problems[0]
    nan = ref.copy()
    nan[0, 0, 0] = np.nan
    assert judge(compare("logits", nan, ref, mask), THRESHOLDS["fp32"])[0], "NaN never passes"
