"""The TorchScript export traced without its weights, which are then written from the model one tensor at a time.

It must give the graph the exporter gives with its weights (same inputs and outputs, the same ONNX
Runtime outputs), write every weight bit for bit as the model holds it (a folded Transpose as the
transposed tensor), and hold no copy of the weights while it does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")


def _with_weights(model: Any, sig: Any, dest: Path) -> None:
    """The former export: the TorchScript exporter with its weights and its constant folding, then saved."""
    import onnx
    import torch

    from converters.onnx import export as ex
    from converters.onnx import graph

    path = dest.parent / f"{dest.name}-raw.onnx"
    args, _ = ex._example(sig, model.dtype)
    with ex._attention_in_half(model), ex.quiet(), torch.no_grad():
        torch.onnx.export(ex._wrapper(model, sig), args, str(path), dynamo=False, input_names=list(sig.inputs),
                          output_names=list(sig.outputs), dynamic_axes=ex._axes(sig), opset_version=ex.OPSET)
    graph.save(onnx.load(str(path)), dest)


def _io(path: Path) -> list[tuple[str, int]]:
    import onnx

    g = onnx.load(str(path / "model.onnx"), load_external_data=False).graph
    return [(v.name, v.type.tensor_type.elem_type) for v in (*g.input, *g.output)]


@pytest.mark.parametrize(("half", "with_past", "tied"), [(True, True, True), (False, False, False)])
def test_same_outputs_as_the_export_with_weights(tmp_path: Path, half: bool, with_past: bool, tied: bool) -> None:
    import numpy as np
    from support.tiny_models import build_tiny_llama

    from converters.onnx import export as ex
    from converters.onnx import verify as onnx_verify

    src = build_tiny_llama(tmp_path / "src", dtype="bfloat16", tie_word_embeddings=tied)
    model, tokenizer = ex.load(src, "text-generation", half=half)
    sig = ex.signature(model, tokenizer, "text-generation", with_past)
    probe = onnx_verify.probes(model, tokenizer, sig)
    ex.export(model, sig, tmp_path / "new", "torchscript")
    _with_weights(model, sig, tmp_path / "old")
    assert _io(tmp_path / "new") == _io(tmp_path / "old")
    runs = [onnx_verify.run(onnx_verify.session(tmp_path / d, "CPUExecutionProvider", half), sig, probe)
            for d in ("new", "old")]
    for new, old in zip(runs[0].cases, runs[1].cases, strict=True):
        assert new.keys() == old.keys() and all(np.array_equal(new[k], old[k]) for k in new)
    assert runs[0].generated is not None or not with_past
    if with_past:
        assert runs[1].generated is not None and np.array_equal(runs[0].generated, runs[1].generated)


def test_weights_are_the_models_bit_for_bit_and_written_once(tmp_path: Path) -> None:
    """Every initializer is a model tensor (or its transpose, for a MatMul) with the same bits; the data file holds
    them and nothing else but alignment padding."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper
    from support.tiny_models import build_tiny_llama

    from converters.onnx import export as ex
    from converters.onnx import graph, initializers

    src = build_tiny_llama(tmp_path / "src", dtype="bfloat16", tie_word_embeddings=True, hidden_size=512,
                           intermediate_size=1024, vocab_size=640)  # MLP weights of 1 MiB: aligned offsets
    model, tokenizer = ex.load(src, "text-generation", half=True)
    ex.export(model, ex.signature(model, tokenizer, "text-generation", False), tmp_path / "out", "torchscript")
    proto = onnx.load(str(tmp_path / "out" / graph.MODEL_FILE))
    written = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    bits = {k: v.view(np.uint16) for k, v in written.items() if v.dtype == np.float16}
    for name, param in model.named_parameters(remove_duplicate=False):
        mine = param.detach().view(torch.int16).numpy().view(np.uint16)
        found = [k for k, v in bits.items() if v.shape in (mine.shape, mine.T.shape)
                 and (np.array_equal(v, mine) or np.array_equal(v, mine.T))]
        assert found, f"{name} is not written as the model holds it"
    assert "model.model.embed_tokens.weight" in written, "the tied table: Gather reads it, the MatMul its transpose"
    assert any(v.shape == (512, 640) for v in written.values()), "the tied output projection, transposed"
    bare = onnx.load(str(tmp_path / "out" / graph.MODEL_FILE), load_external_data=False)
    external = [t for t in bare.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    offsets = {t.name: int(next(e.value for e in t.external_data if e.key == "offset")) for t in external}
    assert all(offsets[t.name] % initializers.ALIGNMENT == 0 for t in external
               if written[t.name].nbytes >= initializers.ALIGN_MIN_BYTES)
    size = (tmp_path / "out" / graph.DATA_FILE).stat().st_size
    payload = sum(written[t.name].nbytes for t in external)
    assert len(external) > 10 and payload <= size < payload + initializers.ALIGNMENT * len(offsets), "no tensor twice"


def test_plan_folds_each_transpose_and_keeps_a_table_both_read() -> None:
    import onnx
    from onnx import helper

    from converters.onnx import initializers

    f = onnx.TensorProto.FLOAT16
    g = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["h"]),
         helper.make_node("Transpose", ["emb"], ["embT"], perm=[1, 0]),
         helper.make_node("Transpose", ["w"], ["wT"]),
         helper.make_node("MatMul", ["h", "wT"], ["h2"]), helper.make_node("MatMul", ["h2", "embT"], ["y"]),
         helper.make_node("Mul", ["y", "scale"], ["z"])],
        "g", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n"]),
              *(helper.make_tensor_value_info(n, f, None) for n in ("emb", "w", "scale", "unused"))],
        [helper.make_tensor_value_info("z", f, None)])
    layout = initializers.plan(g, ["emb", "w", "scale", "unused", "absent"])
    assert sorted(layout.initializers, key=lambda i: i.name) == [
        initializers.Initializer("emb", "emb"), initializers.Initializer("embT", "emb", (1, 0)),
        initializers.Initializer("scale", "scale"), initializers.Initializer("wT", "w", ())]
    assert layout.inputs == {"emb", "w", "scale", "unused"} and layout.folded == {"embT", "wT"}


def test_a_non_finite_weight_is_written_and_found(tmp_path: Path) -> None:
    """A NaN in the model reaches the written file as it is (the NaN check of written initializers still sees it)."""
    import torch
    from support.tiny_models import build_tiny_llama

    from converters.onnx import export as ex
    from converters.onnx import graph

    model, tokenizer = ex.load(build_tiny_llama(tmp_path / "src"), "text-generation", half=True)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[3, 5] = float("nan")
        model.model.norm.weight[0] = float("nan")
    ex.export(model, ex.signature(model, tokenizer, "text-generation", False), tmp_path / "out", "torchscript")
    found = graph.nan_initializers(tmp_path / "out")
    assert sorted(found.values()) == [1, 1] and "model.model.norm.weight" in found
