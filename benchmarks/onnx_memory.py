"""Peak memory of `mreg convert DIR --to onnx:fp16` at Qwen2.5 shapes (random bf16 weights), to calibrate the plan.

    PYTHONPATH=.:tests python benchmarks/onnx_memory.py 0.5b 1.5b 3b [--keep] [--to=onnx:fp16,dynamo]

Each shape (the llama architecture at Qwen2.5-0.5B/1.5B/3B/7B's sizes: hidden, layers, heads, KV heads,
intermediate, vocabulary, tied embeddings) is written as bf16 safetensors into a temporary
directory (1 GB shards, weights streamed to disk), converted by mreg in a subprocess whose process
tree is sampled every 20 ms (as benchmarks/bench_gguf.py samples: the largest sum of anonymous
memory over the tree, and the largest resident set of one process), then deleted. Prints one JSON
line per shape with the parameter count, the plan's estimate (converters/onnx/memory.py) and the
measured peaks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "tie_word_embeddings": True},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "tie_word_embeddings": True},
    "3b": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
           "intermediate_size": 11008, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "tie_word_embeddings": False},
}
VOCAB = 151936


def build(dest: Path, shape: dict[str, Any]) -> Path:
    """A llama-architecture bf16 checkpoint of `shape` with the test suite's tiny BPE tokenizer."""
    from bench_gguf import at_rest, llama_shapes, write_bf16_shards
    from support.tiny_models import build_tiny_llama

    build_tiny_llama(dest)
    for p in dest.glob("*.safetensors*"):
        p.unlink()
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    write_bf16_shards(dest, llama_shapes(h, inter, kv, layers, VOCAB, tied=shape["tie_word_embeddings"]))
    config = json.loads((dest / "config.json").read_text())
    config.update(shape, vocab_size=VOCAB, head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                  torch_dtype="bfloat16", max_position_embeddings=4096)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return at_rest(dest)  # an hour old: a fresh local checkpoint is re-hashed on its next pull


def main(argv: list[str]) -> None:
    """Build, convert and measure each shape named on the command line."""
    from bench_gguf import _status_kb, _tree

    from converters.onnx import memory
    from registry.convert.safetensors import read_header

    keep = "--keep" in argv
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--to=")), "onnx:fp16")
    for name in [a for a in argv if not a.startswith("--")]:
        work = Path(tempfile.mkdtemp(prefix=f"mreg-onnx-mem-{name}-", dir=os.environ.get("TMPDIR", "/tmp")))
        try:
            src = build(work / "src", SHAPES[name])
            headers = [read_header(p) for p in sorted(src.glob("*.safetensors"))]
            plan = memory.plan(headers, half="fp16" in spec, weightless="dynamo" not in spec)
            env = {**os.environ, "MREG_CACHE_DIR": str(work / "cache"), "MREG_STORE": str(work / "store")}
            cmd = [sys.executable, "-c", "import sys; from registry.cli import run; sys.argv[0] = 'mreg'; run()",
                   "convert", str(src), "--to", spec, "--name", "m", "--json"]
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            peak_anon = peak_rss = 0
            while proc.poll() is None:
                stats = [_status_kb(p) for p in _tree(proc.pid)]  # bench_gguf's sampling, the same fields
                peak_anon = max(peak_anon, sum(st.get("RssAnon", 0) for st in stats))
                peak_rss = max([peak_rss, *(st.get("VmRSS", 0) for st in stats)])
                time.sleep(0.02)
            out, err = proc.communicate()
            doc = json.loads(out) if out.strip().startswith("{") else {"raw": out[-400:], "stderr": err[-800:]}
            print(json.dumps({"shape": name, "spec": spec, "parameters": plan.parameters,
                              "estimate_mb": plan.needed >> 20, "available_mb": plan.available >> 20,
                              "peak_anon_mb": peak_anon >> 10, "peak_rss_mb": peak_rss >> 10,
                              "wall_s": round(time.perf_counter() - t0, 1), "exit": proc.returncode,
                              "verification": doc.get("verification", doc.get("error", doc))}), flush=True)
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "tests")]
    main(sys.argv[1:])
