"""Mixture-of-experts GGUF benchmark (run by `python benchmarks/bench.py --only moe`).

A Mixtral-shaped bf16 checkpoint, random weights, Llama 2's SentencePiece tokenizer (bench_gguf's), experts
stored one 2-D tensor each as Mixtral's are (`block_sparse_moe.experts.E.w1/w2/w3`), two experts per token:
`LAYOUTS["8x24"]` has 8 experts in each of 24 layers (hidden 1024, expert feed-forward 2816: 1.8 B parameters,
3.6 GB). It is pulled into the cache, then converted once per type, first runs (no best-of): `mreg convert
--to gguf:F16` and `--to gguf:Q4_K_M` (verification included, its share from the manifest), against llama.cpp's
own path to the same files, `convert_hf_to_gguf.py --outtype f16` then `llama_model_quantize` of that file to
Q4_K_M. The process tree of each command is sampled for memory (`bench_gguf._timed`).

Memory flat in the number of experts: `LAYOUTS["32x6"]` holds the same 192 experts of the same size (so
nearly the same bytes) as 32 experts in each of 6 layers; a layer's stacked expert tensors are four times
larger there. mreg converts it to both types again and llama.cpp's converter to F16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_gguf import (
    _convert_hf_to_gguf,
    _mreg_convert,
    _timed,
    at_rest,
    llama2_tokenizer,
    llama_cpp_or_none,
    llama_quantize_cmd,
    write_bf16_shards,
)

#: Experts per layer and layers: the same 192 experts of the same shape in both.
LAYOUTS = {"8x24": (8, 24), "32x6": (32, 6)}
HIDDEN, EXPERT_FF, HEADS, KV_HEADS, VOCAB = 1024, 2816, 16, 4, 32000
TYPES = ("F16", "Q4_K_M")


def mixtral_shapes(experts: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """The tensor names and shapes of a Mixtral checkpoint (transformers' names), in file order."""
    h, ff, kv = HIDDEN, EXPERT_FF, HIDDEN // HEADS * KV_HEADS
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, h))]
    for i in range(layers):
        pre = f"model.layers.{i}."
        shapes += [(pre + "self_attn.q_proj.weight", (h, h)), (pre + "self_attn.k_proj.weight", (kv, h)),
                   (pre + "self_attn.v_proj.weight", (kv, h)), (pre + "self_attn.o_proj.weight", (h, h)),
                   (pre + "block_sparse_moe.gate.weight", (experts, h))]
        for e in range(experts):
            moe = f"{pre}block_sparse_moe.experts.{e}."
            shapes += [(moe + "w1.weight", (ff, h)), (moe + "w2.weight", (h, ff)), (moe + "w3.weight", (ff, h))]
        shapes += [(pre + "input_layernorm.weight", (h,)), (pre + "post_attention_layernorm.weight", (h,))]
    return [*shapes, ("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]


def build_mixtral(dest: Path, llama_cpp: Path | None, experts: int, layers: int) -> tuple[Path, str]:
    """A Mixtral-shaped bf16 checkpoint with Llama 2's tokenizer, weights streamed to disk; which tokenizer."""
    tokenizer = llama2_tokenizer(dest, llama_cpp)
    write_bf16_shards(dest, mixtral_shapes(experts, layers))
    config = json.loads((dest / "config.json").read_text())
    for key in ("mlp_bias", "pretraining_tp", "attention_bias"):
        config.pop(key, None)
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=HIDDEN,
                  intermediate_size=EXPERT_FF, num_hidden_layers=layers, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, head_dim=HIDDEN // HEADS, vocab_size=VOCAB,
                  num_local_experts=experts, num_experts_per_tok=2, max_position_embeddings=4096,
                  rope_theta=1e6, sliding_window=None, router_aux_loss_coef=0.02, output_router_logits=False,
                  tie_word_embeddings=False)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return at_rest(dest), tokenizer


def _mreg_row(mreg: str, src: Path, qtype: str, name: str, env: dict[str, str], work: Path) -> dict[str, Any]:
    wall, mem, (art,) = _mreg_convert(mreg, src, (qtype,), name, env, work)
    metrics = art["verification"]["metrics"]
    verify = metrics.get("verify_seconds")
    return {"convert_s": round(wall, 2), **mem, "write_s": metrics.get("write_seconds"), "verify_s": verify,
            "reference_s": metrics.get("reference_seconds"),
            "verify_share": round(verify / wall, 2) if verify is not None else None,
            "file_bytes": art["files"][0]["size"], "verification": art["verification"]["status"],
            "kl_divergence": metrics.get("kl_divergence"), "top1_agreement": metrics.get("top1_agreement")}


def _reference(src: Path, llama_cpp: Path, work: Path, env: dict[str, str], quantize: bool) -> dict[str, Any]:
    """llama.cpp's path: convert_hf_to_gguf.py to F16, then (quantize) llama_model_quantize of it to Q4_K_M."""
    f16, q4 = work / "moe-ref-F16.gguf", work / "moe-ref-Q4_K_M.gguf"
    s, mem, _ = _timed(_convert_hf_to_gguf(src, f16, "f16"), {**env, "PYTHONPATH": "gguf-py"}, cwd=llama_cpp,
                       warm=[src])
    out: dict[str, Any] = {"F16": {"s": round(s, 2), **mem, "file_bytes": f16.stat().st_size}}
    if quantize:
        s, mem, _ = _timed(llama_quantize_cmd(f16, q4), env, warm=[f16])
        out["Q4_K_M"] = {"s": round(s, 2), **mem, "file_bytes": q4.stat().st_size}
        out["F16_then_Q4_K_M_s"] = round(out["F16"]["s"] + out["Q4_K_M"]["s"], 2)
    f16.unlink(missing_ok=True)
    q4.unlink(missing_ok=True)
    return out


def bench_moe(work: Path, results: dict[str, Any]) -> None:
    """mreg pull + convert of an 8-expert Mixtral to F16 and Q4_K_M against llama.cpp's tools, then 32 experts."""
    llama_cpp = llama_cpp_or_none(work, "moe")
    mreg = str(Path(sys.executable).parent / "mreg")
    out: dict[str, Any] = {}
    for layout, (experts, layers) in LAYOUTS.items():
        cache, store = work / f"moe-cache-{layout}", work / f"moe-store-{layout}"
        env = {**os.environ, "MREG_CACHE_DIR": str(cache), "MREG_STORE": str(store)}
        src, tokenizer = build_mixtral(work / f"mixtral-{layout}", llama_cpp, experts, layers)
        t_pull, mem_pull, _ = _timed([mreg, "pull", str(src), "--json"], env, warm=[src])
        row: dict[str, Any] = {"experts": experts, "layers": layers, "experts_per_token": 2, "tokenizer": tokenizer,
                               "source_bytes": sum(p.stat().st_size for p in src.iterdir()),
                               "pull_s": round(t_pull, 2), "pull_memory": mem_pull}
        for qtype in TYPES:
            row[qtype] = _mreg_row(mreg, src, qtype, f"moe-{layout}-{qtype.lower()}", env, work)
            print(f"moe {layout} mreg {qtype}: {row[qtype]}", flush=True)
        if llama_cpp is not None:
            try:
                row["llama_cpp"] = _reference(src, llama_cpp, work, env, quantize=layout == next(iter(LAYOUTS)))
            except subprocess.CalledProcessError as e:
                row["llama_cpp"] = {"error": f"exit {e.returncode}: {(e.stderr or '')[-400:]}"}
            print(f"moe {layout} llama.cpp: {row['llama_cpp']}", flush=True)
        out[layout] = row
        for done in (src, cache, store):
            subprocess.run(["chmod", "-R", "u+w", str(done)], check=False)
            subprocess.run(["rm", "-rf", str(done)], check=False)
    results["gguf_moe"] = out
    print(f"moe: {json.dumps(out)}", flush=True)
