"""GGUF conversion benchmark (run by `python tests/bench.py --only gguf`, part of `nox -s bench`).

A 1.1 B-parameter llama in the TinyLlama shape (hidden 2048, 22 layers, 32 heads, 4 KV heads,
intermediate 5632, vocab 32000), bf16, random weights, is pulled into the cache once; then
`mreg convert --to gguf:F16 | Q8_0 | Q4_K_M` runs as a process under /usr/bin/time (wall time
and peak RSS, which includes the llama.cpp verification child), beside `cp` of the same input and
llama.cpp's own `llama_model_quantize` from mreg's F16 file (the second step of the reference path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

TINYLLAMA = {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
             "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048}
TYPES = ("F16", "Q8_0", "Q4_K_M")


def _random_bf16(shape: tuple[int, ...], seed: int) -> Callable[[BinaryIO], None]:
    """A writer of N(0, 0.02) bf16 values, generated 4M at a time."""

    def write(f: BinaryIO) -> None:
        rng = np.random.default_rng(seed)
        left = int(np.prod(shape))
        while left:
            n = min(left, 1 << 22)
            v = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
            f.write((v >> 16).astype("<u2").tobytes())
            left -= n

    return write


def build_tinyllama(dest: Path) -> Path:
    """The TinyLlama-shaped bf16 checkpoint: tokenizer and config from tiny_models, weights streamed to disk."""
    from tiny_models import build_tiny_llama, write_safetensors

    build_tiny_llama(dest, dtype="bfloat16")
    for p in dest.glob("*.safetensors*"):
        p.unlink()
    c = TINYLLAMA
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        shapes += [(pre + "self_attn.q_proj.weight", (h, h)), (pre + "self_attn.k_proj.weight", (kv, h)),
                   (pre + "self_attn.v_proj.weight", (kv, h)), (pre + "self_attn.o_proj.weight", (h, h)),
                   (pre + "mlp.gate_proj.weight", (inter, h)), (pre + "mlp.up_proj.weight", (inter, h)),
                   (pre + "mlp.down_proj.weight", (h, inter)), (pre + "input_layernorm.weight", (h,)),
                   (pre + "post_attention_layernorm.weight", (h,))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * int(np.prod(shape))
        if size + nbytes > 1 << 30 and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    index: dict[str, str] = {}
    for k, group in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = []
        for j, (name, shape) in enumerate(group):
            if len(shape) == 1:
                data: Any = (np.ones(shape, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            else:
                data = _random_bf16(shape, 1000 * k + j)
            tensors.append((name, "BF16", shape, data))
            index[name] = fname
        write_safetensors(dest / fname, tensors, {"format": "pt"})
    total = sum(2 * int(np.prod(s)) for _, s in shapes)
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": index}, indent=2))
    config = json.loads((dest / "config.json").read_text())
    config.update(TINYLLAMA, head_dim=h // c["num_attention_heads"], tie_word_embeddings=False)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return dest


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MB (GNU time: the largest process of the tree) and stdout of a command."""
    t0 = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    rss_kb = float(done.stderr.strip().splitlines()[-1])
    return wall, rss_kb / 1024, done.stdout


def _llama_quantize(src: Path, dest: Path, env: dict[str, str], ftype: int = 15) -> float | None:
    """llama.cpp's own llama_model_quantize (2 threads), same machine and moment: the reference second step."""
    code = ("import ctypes, sys, llama_cpp\n"
            "p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]); p.nthread = 2\n"
            "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")
    try:
        wall, _, _ = _timed([sys.executable, "-c", code, str(src), str(dest), str(ftype)], env)
    except subprocess.CalledProcessError:
        return None
    dest.unlink(missing_ok=True)
    return round(wall, 2)


def bench_gguf(work: Path, results: dict[str, Any]) -> None:
    """mreg convert to F16, Q8_0 and Q4_K_M on a 1.1 B bf16 llama, against cp of the input."""
    src = build_tinyllama(work / "tinyllama")
    nbytes = sum(p.stat().st_size for p in src.iterdir())
    mreg = str(Path(sys.executable).parent / "mreg")
    env = {**os.environ, "MREG_CACHE_DIR": str(work / "gguf-cache"), "MREG_STORE": str(work / "gguf-store")}
    subprocess.run(["sync"], check=False)
    t_cp, _, _ = _timed(["cp", "-r", str(src), str(work / "cp-copy")], env)
    t_pull, rss_pull, _ = _timed([mreg, "pull", str(src), "--json"], env)
    out: dict[str, Any] = {"source_bytes": nbytes, "cp_s": round(t_cp, 2), "pull_s": round(t_pull, 2),
                           "pull_peak_rss_mb": round(rss_pull)}
    for qtype in TYPES:
        wall, rss, stdout = _timed([mreg, "convert", str(src), "--to", f"gguf:{qtype}", "--name", f"b-{qtype.lower()}",
                                    "--json"], env)
        doc = json.loads(stdout)
        manifest = json.loads((work / "gguf-store" / "models" / f"b-{qtype.lower()}" / "versions"
                               / str(doc["version"]) / "manifest.json").read_text())
        art = manifest["artifacts"][0]
        out[qtype] = {"convert_s": round(wall, 2), "peak_rss_mb": round(rss),
                      "write_s": art["verification"]["metrics"].get("write_seconds"),
                      "verify_s": art["verification"]["metrics"].get("verify_seconds"),
                      "file_bytes": art["files"][0]["size"], "verification": art["verification"]["status"],
                      "logits_compared": "kl_divergence" in art["verification"]["metrics"],
                      "ratio_to_cp": round(wall / t_cp, 1)}
        print(f"gguf {qtype}: {out[qtype]}", flush=True)
        if qtype == "F16":
            f16 = work / "gguf-store" / "models" / "b-f16" / "versions" / str(doc["version"]) / "gguf" / \
                art["files"][0]["path"]
            out["llama_quantize_F16_to_Q4_K_M_s"] = _llama_quantize(f16, work / "ref-Q4_K_M.gguf", env)
            out["llama_quantize_F16_to_Q8_0_s"] = _llama_quantize(f16, work / "ref-Q8_0.gguf", env, ftype=7)
    results["gguf_1.1B"] = out
    print(f"gguf: {out}", flush=True)
