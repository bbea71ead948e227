"""Quantization quality benchmark (run by `python benchmarks/bench.py --only quality`, part of `nox -s bench`).

On the 1.1 B TinyLlama-shaped bf16 checkpoint of `bench_gguf` (random weights, Llama 2's tokenizer when
llama.cpp's source is there): one `mreg convert --to gguf:Q4_K_M --calibration default` (the importance
matrix computed by mreg, timed), then each type of `TYPES` converted without and with that matrix
(`--imatrix` the file the first conversion stored, so it is computed once), every file measured on the
shipped evaluation text (`--evaluation default --eval-tokens EVAL_TOKENS`): mean and p99 KL divergence,
top-1 agreement and the perplexity ratio that llama.cpp on the file gives against mreg's float32 reference.

Random weights make every quantization's KL larger and an importance matrix's gain smaller than on a trained
model: the table shows the encodings' relative cost here, not what a real checkpoint loses.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "IQ3_M", "IQ2_M")
EVAL_TOKENS = 256


def _convert(mreg: str, src: Path, qtype: str, name: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    import subprocess

    t0 = time.perf_counter()
    done = subprocess.run([mreg, "convert", str(src), "--to", f"gguf:{qtype}", "--name", name, "--evaluation",
                           "default", "--eval-tokens", str(EVAL_TOKENS), *extra, "--json"], env=env,
                          capture_output=True, text=True, check=False)
    wall = round(time.perf_counter() - t0, 2)
    doc = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    if done.returncode != 0:
        return {"wall_s": wall, "exit": done.returncode, "error": (doc.get("error") or {}).get("message")
                or done.stderr[-300:]}
    store = Path(env["MREG_STORE"])
    manifest = json.loads((store / "models" / name / "versions" / str(doc["version"]) / "manifest.json").read_text())
    art = next(a for a in manifest["artifacts"] if a["format"] == "gguf")
    m = art["verification"]["metrics"]
    keys = ("kl_divergence", "kl_divergence_p99", "top1_agreement", "perplexity_ratio", "evaluation_tokens")
    return {"wall_s": wall, "file_bytes": max(f["size"] for f in art["files"]), "status": art["verification"]["status"],
            **{k: m.get(k) for k in keys}, "imatrix": art["requirements"].get("imatrix"),
            "path": str(store / "models" / name / "versions" / str(doc["version"]) / "gguf")}


def bench_quality(work: Path, results: dict[str, Any]) -> None:
    """The KL/perplexity table of TYPES with and without an importance matrix, and the matrix's cost."""
    from bench_gguf import build_tinyllama
    from support.llama_cpp_source import Unavailable, source

    try:
        llama_cpp: Path | None = source(work / "llama-cpp-source", allow_download=True)
    except Unavailable:
        llama_cpp = None
    src, tokenizer = build_tinyllama(work / "tinyllama", llama_cpp)
    mreg = str(Path(sys.executable).parent / "mreg")
    env = {**os.environ, "MREG_CACHE_DIR": str(work / "q-cache"), "MREG_STORE": str(work / "q-store")}
    out: dict[str, Any] = {"tokenizer": tokenizer, "eval_tokens": EVAL_TOKENS}
    first = _convert(mreg, src, "Q4_K_M", "q-imatrix", env, "--calibration", "default")
    out["imatrix_run"] = first
    print(f"quality: imatrix + Q4_K_M {first}", flush=True)
    imx = first.get("imatrix") or {}
    given = Path(first["path"]) / imx["file"] if imx.get("file") else None
    rows: dict[str, Any] = {}
    for qtype in TYPES:
        row = {"without": _convert(mreg, src, qtype, f"q-{qtype.lower()}", env)}
        if given is not None and qtype not in ("F16", "Q8_0"):  # their encoders read no importance
            row["with"] = _convert(mreg, src, qtype, f"q-{qtype.lower()}-imx", env, "--imatrix", str(given))
        rows[qtype] = row
        print(f"quality {qtype}: {row}", flush=True)
    out["types"] = rows
    results["quality_1.1B"] = out
