"""`mreg convert --to onnx` for decoder LLMs: logits, and a KV cache that generates like transformers.

Tiny random llama / mistral / qwen2 / qwen3 directories (real safetensors, real tokenizers) are converted through
the CLI; the published tree is then driven by ONNX Runtime directly, as a serving engine would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert
from support.llama_cpp_source import build_model, read_vocab

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_logits_with_dynamic_axes(kind: str, mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    import numpy as np
    import onnxruntime as ort

    doc = convert(mreg, tiny_model(kind), "onnx")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert v["status"] == "passed" and "generation.tokens" not in v["metrics"]
    m = v["metrics"]
    assert m["logits.max_abs_diff"] <= v["tolerance"]["logits.max_abs_diff"] == pytest.approx(
        1e-4 + 1e-5 * m["logits.reference_max_abs"])
    assert m["logits.top1_agreement"] == 1.0 and m["logits.nonfinite"] == 0.0
    assert {"generation_config.json", "tokenizer.json", "config.json"} <= {f["path"] for f in art["files"]}
    sess = ort.InferenceSession(str(tree / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input_ids", "attention_mask", "position_ids"]
    assert [o.name for o in sess.get_outputs()] == ["logits"]
    ids = np.arange(3, 3 + 5 * 11, dtype=np.int64).reshape(5, 11)
    (logits,) = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                "position_ids": np.tile(np.arange(11, dtype=np.int64), (5, 1))})
    assert logits.shape == (5, 11, 320)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
@pytest.mark.slow
def test_with_past_generates_like_transformers(kind: str, mreg: Any, store_root: Path,
                                               tiny_model: Callable[..., Path]) -> None:
    doc = convert(mreg, tiny_model(kind), "onnx:with-past")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    assert art["options"]["with_past"] is True
    v = art["verification"]
    m, tol = v["metrics"], v["tolerance"]
    assert v["status"] == "passed"
    assert m["generation.tokens_equal"] == 1.0 == tol["generation.tokens_equal"]
    assert m["generation.tokens"] == 32.0, "16 greedy tokens for each of two left-padded prompts"
    assert m["generation.logits.max_abs_diff"] <= 1e-4 and m["generation.nonfinite"] == 0.0
    layers = {k.split(".")[1] for k in m if k.startswith("present.")}
    assert layers == {"0", "1"}
    for layer in layers:
        for kv in ("key", "value"):
            assert m[f"present.{layer}.{kv}.max_abs_diff"] <= tol[f"present.{layer}.{kv}.max_abs_diff"]
    assert any("greedy generation of 16 tokens" in i for i in v["inputs"])
    _decode_from_the_published_tree(tree, kind)


def _decode_from_the_published_tree(tree: Path, kind: str) -> None:
    """Drive the KV cache from the store's files: one prompt step, then one token at a time."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tree / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    past_names = [n for n in names if n.startswith("past_key_values.")]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"] and len(past_names) == 4
    shape = sess.get_inputs()[3].shape
    assert shape[0] == "batch" and isinstance(shape[2], str), f"{kind}: batch and past length are dynamic"
    heads, dim = shape[1], shape[3]
    past = {n: np.zeros((3, heads, 0, dim), np.float32) for n in past_names}
    ids = np.array([[5, 6, 7, 8]] * 3, dtype=np.int64)
    mask, pos = np.ones_like(ids), np.tile(np.arange(4, dtype=np.int64), (3, 1))
    for _ in range(3):
        out = sess.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": pos, **past})
        past = {n: out[1 + i] for i, n in enumerate(past_names)}
        ids = out[0][:, -1:].argmax(-1).astype(np.int64)
        pos, mask = pos[:, -1:] + 1, np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
    assert past[past_names[0]].shape == (3, heads, 6, dim)


def test_fp16_with_past_keeps_a_float16_cache(mreg: Any, store_root: Path,
                                              tiny_model: Callable[..., Path]) -> None:
    import onnx

    doc = convert(mreg, tiny_model("llama"), "onnx:with-past,fp16")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert v["status"] == "passed" and "fp16 thresholds" in v["method"]
    assert v["metrics"]["logits.min_cosine"] >= v["tolerance"]["logits.min_cosine"] == 0.999
    assert v["metrics"]["logits.top1_agreement"] >= v["tolerance"]["logits.top1_agreement"] == 0.95
    assert "generation.tokens_equal" in v["metrics"] and "generation.tokens_equal" not in v["tolerance"], \
        "fp16 generation is recorded, not gated: a near tie may flip an argmax"
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.graph.input, *graph.graph.output]}
    assert types["logits"] == onnx.TensorProto.FLOAT
    assert types["past_key_values.0.key"] == types["present.1.value"] == onnx.TensorProto.FLOAT16


@pytest.mark.slow
def test_int8_optimized_decoder(mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    doc = convert(mreg, tiny_model("qwen2"), "onnx:with-past,int8,optimize")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert v["status"] == "passed" and "int8 thresholds" in v["method"]
    assert v["metrics"]["logits.top1_agreement"] >= v["tolerance"]["logits.top1_agreement"] == 0.8
    assert v["metrics"]["logits.mean_cosine"] >= 0.98 and v["metrics"]["generation.nonfinite"] == 0.0


def test_with_past_is_refused_for_an_encoder(mreg: Any, tmp_path: Path) -> None:
    from support.tiny_models import build_tiny_bert

    r = mreg("convert", build_tiny_bert(tmp_path / "b"), "--to", "onnx:with-past", "--name", "m", "--json")
    assert r.exit_code == 2 and "decoder LLMs only" in r.json["error"]["message"]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.slow
def test_dynamo_exporter_is_verified_like_torchscript(kind: str, mreg: Any, store_root: Path,
                                                      tiny_model: Callable[..., Path]) -> None:
    """torch.export's graph must generate like transformers from the published tree, one token at a time."""
    doc = convert(mreg, tiny_model(kind), "onnx:with-past,dynamo")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert art["options"]["exporter"] == "dynamo" and v["status"] == "passed"
    assert v["metrics"]["generation.tokens_equal"] == 1.0 and v["metrics"]["logits.max_abs_diff"] <= 1e-4
    _decode_from_the_published_tree(tree, kind)


@pytest.mark.slow
def test_sentencepiece_tokenizer_checkpoint(mreg: Any, store_root: Path, tiny_model: Callable[..., Path]) -> None:
    """A Llama-2-style checkpoint with only tokenizer.model: transformers must read it (protobuf >= 7.36)."""
    doc = convert(mreg, tiny_model("llama-spm"), "onnx")
    art, tree = artifact(store_root, "m", doc["version"], "onnx")
    assert art["verification"]["status"] == "passed" and (tree / "tokenizer.model").is_file()


@pytest.mark.slow
def test_generation_reference_ignores_the_checkpoints_sampling_defaults(mreg: Any, store_root: Path,
                                                                       tiny_model: Callable[..., Path]) -> None:
    """generation_config.json's repetition_penalty (Qwen2.5-Instruct ships 1.05) is not greedy decoding.

    transformers' generate() fills what its caller leaves unset from that file; the reference must be
    the argmax the ONNX model is held to, so the conversion passes whatever the file says.
    """
    src = tiny_model("qwen2")
    path = src / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "repetition_penalty": 10.0, "do_sample": True}))
    doc = convert(mreg, src, "onnx:torchscript,with-past")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    assert art["verification"]["status"] == "passed"
    assert art["verification"]["metrics"]["generation.tokens_equal"] == 1.0


def test_plain_greedy_drops_sampling_defaults_but_stops_at_eos(tiny_model: Callable[..., Path]) -> None:
    """The reference generate() (ONNX verification, `mreg check` on hf) is argmax and ends where the model ends."""
    import torch
    import transformers

    from converters.hf.tokenizer import plain_greedy

    src = tiny_model("llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    enc = transformers.AutoTokenizer.from_pretrained(src)("Hello world", return_tensors="pt")
    n = enc["input_ids"].shape[1]
    with torch.no_grad(), plain_greedy(model):
        free = model.generate(**enc, max_new_tokens=6, do_sample=False)[0, n:].tolist()
    assert len(free) == 6
    # The checkpoint now says: stop at the first greedy token, and penalize repeats heavily.
    model.generation_config.eos_token_id = free[0]
    model.generation_config.repetition_penalty = 10.0
    with torch.no_grad(), plain_greedy(model):
        stopped = model.generate(**enc, max_new_tokens=6, do_sample=False)[0, n:].tolist()
    assert stopped == free[:1], "ends at the model's end-of-sequence token"
    assert model.generation_config.repetition_penalty == 10.0, "the checkpoint's settings are back afterwards"


@pytest.mark.parametrize("name", ["qwen2", "llama-bpe"])
@pytest.mark.slow
def test_with_past_and_a_real_tokenizer(name: str, llama_cpp_root: Path, mreg: Any, store_root: Path,
                                        tmp_path: Path) -> None:
    """Qwen's and Llama 3's real tokenizers (llama.cpp's vocabulary files, support/llama_cpp_source.py) on a tiny model:
    verification tokenizes with them, pads on the left with their pad (or EOS) token, and generates."""
    src = build_model(read_vocab(llama_cpp_root, name), tmp_path / name)
    doc = convert(mreg, src, "onnx:with-past")
    art, _ = artifact(store_root, "m", doc["version"], "onnx")
    v = art["verification"]
    assert v["status"] == "passed", v["detail"]
    assert v["metrics"]["generation.tokens_equal"] == 1.0 and v["metrics"]["logits.top1_agreement"] == 1.0
    assert any(len(text) > 20 for text in v["inputs"]), "real text went through the real tokenizer"


def test_the_reference_beside_the_trace_is_the_reference_alone(tiny_model: Callable[..., Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's reference runs in a second thread while TorchScript traces: neither may see the other."""
    import sys
    import threading

    import numpy as np
    import torch

    from converters.onnx import export as ex
    from converters.onnx import graph
    from converters.onnx import verify as onnx_verify
    from converters.onnx.converter import _pytorch_reference
    from registry.progress import NoProgress

    model, tokenizer = ex.load(tiny_model("qwen3"), "text-generation")
    sig = ex.signature(model, tokenizer, "text-generation", True)
    probe = onnx_verify.probes(model, tokenizer, sig)
    alone = onnx_verify.reference(model, sig, probe)
    ex.export(model, sig, tmp_path / "alone", "torchscript")
    stdout, threads = sys.stdout, torch.get_num_threads()
    ran_in: list[str] = []
    real = onnx_verify.reference
    monkeypatch.setattr(onnx_verify, "reference",
                        lambda *a: ran_in.append(threading.current_thread().name) or real(*a))
    with _pytorch_reference(model, sig, probe, NoProgress(), beside=True) as reference:
        ex.export(model, sig, tmp_path / "beside", "torchscript")
        beside = reference()
    assert ran_in and ran_in[0].startswith("mreg-reference"), ran_in
    assert sys.stdout is stdout, "the quiet() blocks of both threads restored the real stdout"
    assert torch.get_num_threads() == threads, "PyTorch's thread count is restored"
    for a, b in zip(alone.cases, beside.cases, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert alone.generated is not None and beside.generated is not None
    assert np.array_equal(alone.generated, beside.generated)
    for name in (graph.MODEL_FILE, graph.DATA_FILE):
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "beside" / name).read_bytes(), name


def test_verification_runs_on_cuda_where_onnx_runtime_has_it(mreg: Any, store_root: Path,
                                                               tiny_model: Callable[..., Path]) -> None:
    """The probes run on ONNX Runtime's CUDA provider too where it has a device; otherwise the record says why not."""
    import onnxruntime as ort

    doc = convert(mreg, tiny_model("llama"), "onnx:with-past")
    v = artifact(store_root, "m", doc["version"], "onnx")[0]["verification"]
    m, tol = v["metrics"], v["tolerance"]
    assert v["status"] == "passed" and m["generation.tokens_equal"] == 1.0, "the CPU provider always runs"
    if "cuda.logits.max_abs_diff" in m:
        assert "CUDAExecutionProvider (metrics cuda.*)" in v["method"]
        assert m["cuda.logits.max_abs_diff"] <= tol["cuda.logits.max_abs_diff"] == pytest.approx(
            1e-4 + 1e-5 * m["cuda.logits.reference_max_abs"])
        assert m["cuda.generation.tokens_equal"] == tol["cuda.generation.tokens_equal"] == 1.0
        assert m["cuda.present.0.key.nonfinite"] == 0.0
    elif "CUDAExecutionProvider" in ort.get_available_providers():
        assert "not on CUDA: onnxruntime-gpu found no usable CUDA device" in v["method"]
    else:
        assert "not on CUDA: onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)" in v["method"]
        assert not any(k.startswith("cuda.") for k in m)


def test_a_failed_export_does_not_wait_for_the_reference(mreg: Any, store_root: Path, tiny_model: Callable[..., Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The error is reported at once; the reference thread is left to finish on its own."""
    import threading
    import time

    from converters.onnx import export as onnx_export
    from converters.onnx import verify as onnx_verify

    release, real = threading.Event(), onnx_verify.reference
    monkeypatch.setattr(onnx_verify, "reference", lambda *a: release.wait(60) and real(*a))

    def broken(*_: Any) -> None:
        raise RuntimeError("the exporter gave up")

    monkeypatch.setattr(onnx_export, "export", broken)
    started = time.monotonic()
    r = mreg("convert", tiny_model("llama"), "--to", "onnx:with-past", "--name", "m", "--json")
    waited = time.monotonic() - started
    release.set()
    assert r.exit_code == 1 and "the exporter gave up" in r.json["error"]["message"]
    assert waited < 30, f"the error waited {waited:.0f} s for the reference"
    assert not (store_root / "models" / "m").exists()
