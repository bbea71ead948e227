"""Phi-3, Gemma 2/3, Qwen3-MoE, Qwen2-MoE and Mixtral against llama.cpp's converter and quantizer, same checkpoint.

Each tiny model is built once for the module with transformers' own config class; llama.cpp's
`convert_hf_to_gguf.py` writes its F16 and F32 files in one process, and `llama_model_quantize` makes Q8_0 and
Q4_K_M from the F32 one. mreg's F16, Q8_0 and Q4_K_M must hold the same metadata (but the general.* naming
keys), the same tensors with the same types and the same bytes; the conversion through the CLI must pass its
verification (llama.cpp loads the file, its logits against mreg's float32 reference).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import convert

from converters.gguf.converter import write
from converters.gguf.mix import FILE_TYPES
from converters.gguf.model import SafetensorsReader
from converters.gguf.plan import plan

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

KINDS = ["phi3", "phi3-longrope", "phi3-vocab", "granite", "olmo2", "gemma", "gemma2", "gemma3", "qwen3moe", "mixtral",
         "qwen2moe"]
#: The tiny BPE tokenizer's check-text hash is in no table of llama.cpp's converter (it refuses it); for those the
#: driver names the pre-tokenizer as mreg does (by its structure), and every other key and tensor is compared.
PRE_NAMED = {"qwen3moe": "gpt-2", "qwen2moe": "gpt-2", "olmo2": "gpt-2"}
TYPES = ["F16", "Q8_0", "Q4_K_M"]
#: Keys that name the file rather than describe the model (mreg names it after the model in the store).
NAMING = ("general.name", "general.size_label", "general.tags", "general.type", "general.basename",
          "general.finetune")

_DRIVER = """
import json, runpy, sys
import conversion.base
real = conversion.base.TextModel.get_vocab_base_pre
for src, out, outtype, pre in json.loads(sys.argv[1]):
    conversion.base.TextModel.get_vocab_base_pre = (lambda self, tok, pre=pre: pre) if pre else real
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", outtype]
    try:
        runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
    except SystemExit as e:
        if e.code:
            print(f"FAILED {src}: exit {e.code}", flush=True)
"""


def _real_phi3_vocab(root: Path, dest: Path) -> Path:
    """A tiny Phi-3 carrying Phi-3's real tokenizer (llama.cpp's ggml-vocab-phi-3: SentencePiece, 32064 ids with
    the added chat tokens), which llama.cpp's Phi-3 converter reads its own way (not _set_vocab_sentencepiece)."""
    import torch
    import transformers
    from support.llama_cpp_source import read_vocab, write_tokenizer

    v = read_vocab(root, "phi-3")
    cfg = transformers.Phi3Config(vocab_size=v.size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, pad_token_id=None, bos_token_id=v.bos,
                                  eos_token_id=v.eos)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(dest)
    write_tokenizer(v, dest)
    return dest


@pytest.fixture(scope="module")
def sources(llama_cpp_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from test_converters.conftest import BUILDERS

    base = tmp_path_factory.mktemp("families")
    # general.name comes from the directory's name, and llama.cpp applies its Phi-3 token rules to a name holding
    # "phi3", which need Phi-3's own special tokens: the tiny phi3 models carry llama's small vocabulary, so their
    # directories are named otherwise (phi3-vocab, with Phi-3's real vocabulary, keeps its name).
    return {kind: _real_phi3_vocab(llama_cpp_root, base / kind) if kind == "phi3-vocab"
            else BUILDERS[kind](base / kind.replace("phi3", "tiny-p3"))
            for kind in KINDS}


@pytest.fixture(scope="module")
def theirs(llama_cpp_root: Path, sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """(kind, type) -> llama.cpp's file: its converter's F16, its quantizer's Q8_0 and Q4_K_M from its F32."""
    out = tmp_path_factory.mktemp("llama-cpp-files")
    jobs = [(str(src), str(out / f"{kind}-{t}.gguf"), t.lower(), PRE_NAMED.get(kind)) for kind, src in sources.items()
            for t in ("F16", "F32")]
    env = {**os.environ, "PYTHONPATH": "gguf-py", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(jobs)], cwd=llama_cpp_root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "FAILED" not in done.stdout and done.returncode == 0, done.stdout + done.stderr[-3000:]
    files = {}
    for kind in sources:
        files[f"{kind}-F16"] = out / f"{kind}-F16.gguf"
        for t in ("Q8_0", "Q4_K_M"):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = FILE_TYPES[t][1], 2
            dest = out / f"{kind}-{t}.gguf"
            assert llama_cpp.llama_model_quantize(str(out / f"{kind}-F32.gguf").encode(), str(dest).encode(),
                                                  ctypes.byref(params)) == 0
            files[f"{kind}-{t}"] = dest
    return files


def _read(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, list[int], bytes]]]:
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.") and k not in NAMING}
    tensors = {t.name: (t.tensor_type.name, [int(d) for d in t.shape], bytes(t.data.tobytes())) for t in reader.tensors}
    return meta, tensors


@pytest.mark.parametrize("file_type", TYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_file_equals_llama_cpps(kind: str, file_type: str, sources: dict[str, Path], theirs: dict[str, Path],
                                tmp_path: Path) -> None:
    src = sources[kind]
    p = plan(src, sorted(src.glob("*.safetensors")), file_type, "m")
    reader = SafetensorsReader()
    try:
        write([p], [tmp_path / "mreg.gguf"], reader, workers=2)
    finally:
        reader.close()
    ours_meta, ours = _read(tmp_path / "mreg.gguf")
    their_meta, their = _read(theirs[f"{kind}-{file_type}"])
    assert ours_meta == their_meta
    assert {n: t[:2] for n, t in ours.items()} == {n: t[:2] for n, t in their.items()}, "names, types, shapes"
    assert [n for n in ours if ours[n][2] != their[n][2]] == [], "tensor bytes"
    if kind == "phi3-longrope":
        assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= set(ours)
        assert ours_meta["phi3.rope.dimension_count"] == 12, "3/4 of a 16-wide head rotates"
    if kind == "phi3" and file_type == "Q4_K_M":
        # llama.cpp's ATTENTION_QKV rule (Q5_K) is never reached: the attn_v rules take a fused qkv first
        assert [ours[f"blk.{i}.attn_qkv.weight"][0] for i in (0, 1)] == ["Q4_K", "Q6_K"]
    if kind == "qwen3moe":
        assert ours["blk.0.ffn_gate_exps.weight"][1] == [256, 256, 8], "eight experts stacked (GGUF order: ne)"
        assert ours["blk.0.ffn_gate_inp.weight"][0] == "F32", "the router is never quantized"
        if file_type == "Q4_K_M":
            assert ours["blk.0.attn_v.weight"][0] == "Q8_0" and ours["blk.0.attn_output.weight"][0] == "Q5_K"
    if kind == "mixtral":
        assert ours_meta["general.architecture"] == "llama" and ours_meta["llama.expert_count"] == 4
        assert ours["blk.1.ffn_down_exps.weight"][1] == [64, 64, 4]
    if kind == "qwen2moe":
        shared_gate = ours["blk.0.ffn_gate_inp_shexp.weight"]
        assert shared_gate[:2] == ("F32", [64, 1] if file_type == "F16" else [64]), "as converter / quantizer write it"
        assert {"blk.0.ffn_up_shexp.weight", "blk.0.attn_q.bias"} <= set(ours)
    if kind == "granite":
        assert ours_meta["granite.logit_scale"] == 8.0 and ours_meta["granite.residual_scale"] == pytest.approx(0.22)
    if kind.startswith("gemma"):
        assert "output.weight" not in ours and ours_meta["tokenizer.ggml.add_space_prefix"] is False
        if kind == "gemma":  # no window; CodeGemma's end-of-turn id, whatever the vocabulary (as llama.cpp writes it)
            assert ours_meta["tokenizer.ggml.eot_token_id"] == 107 and "gemma.attention.sliding_window" not in ours_meta
        else:
            assert ours_meta[f"{kind}.attention.sliding_window"] == 4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_converts_and_llama_cpp_agrees_with_the_reference(kind: str, sources: dict[str, Path], mreg: Any) -> None:
    doc = convert(mreg, sources[kind], "gguf:Q4_K_M", "m")
    assert doc["verification"] == {"gguf": "passed"}


def test_stacked_experts_are_read_one_expert_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of a 3-D expert tensor come from each expert's own source tensor, a chunk never more than asked: the
    same values as stacking them whole, at every chunk boundary (within an expert and across two)."""
    import numpy as np
    from test_converters.conftest import BUILDERS

    from converters.gguf import model as gguf_model

    src = BUILDERS["mixtral"](tmp_path / "mixtral", intermediate_size=8)
    p = plan(src, sorted(src.glob("*.safetensors")), "F32", "m")
    (t,) = [t for t in p.model.tensors if t.name == "blk.0.ffn_gate_exps.weight"]
    assert t.shape == (4, 8, 64) and len(t.parts) == 4
    reads: list[tuple[str, int, int]] = []
    real = gguf_model.SafetensorsReader._read

    def spy(self: Any, source: Any, start: int, stop: int, ncols: int) -> Any:
        reads.append((str(source.offset), start, stop))
        return real(self, source, start, stop, ncols)

    monkeypatch.setattr(gguf_model.SafetensorsReader, "_read", spy)
    reader = SafetensorsReader()
    try:
        whole = np.concatenate([reader._read(part, 0, 8, 64) for part in t.parts])
        reads.clear()
        for start, stop in [(0, 3), (3, 13), (13, 32)]:
            np.testing.assert_array_equal(reader.rows(t, start, stop), whole[start:stop])
    finally:
        reader.close()
    assert max(stop - start for _, start, stop in reads) <= 8, "never more than one expert's rows in one read"


@pytest.mark.parametrize(("change", "message"), [
    ({"num_local_experts": 5}, "config.json says 5 experts"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, "DeepseekV3ForCausalLM is not supported"),
])
def test_a_mixture_that_does_not_fit_is_refused_before_output(change: dict[str, Any], message: str, tmp_path: Path,
                                                            mreg: Any) -> None:
    from support.tiny_models import rewrite_config
    from test_converters.conftest import BUILDERS

    src = rewrite_config(BUILDERS["mixtral"](tmp_path / "mixtral"), **change)
    r = mreg("convert", src, "--to", "gguf:Q8_0", "--name", "m", "--json")
    assert r.exit_code in (2, 4) and message in r.json["error"]["message"], r.json
    assert "Qwen3MoeForCausalLM" in r.stderr or r.exit_code == 4, "an unknown architecture's hint lists the supported"
