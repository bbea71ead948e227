"""Quantization quality benchmark (run by `python benchmarks/bench.py --only quality`, part of `nox -s bench`).

On the 1.1 B TinyLlama-shaped bf16 checkpoint of `bench_gguf` (random weights, Llama 2's tokenizer when
llama.cpp's source is there): one `mreg convert --to gguf:Q4_K_M --calibration default` (the importance
matrix computed by mreg, timed), then each type of `TYPES` converted without and with that matrix
(`--imatrix` the file the first conversion stored, so it is computed once), every file measured on the
shipped evaluation text (`--evaluation default --eval-tokens EVAL_TOKENS`): mean and p99 KL divergence,
top-1 agreement and the perplexity ratio that llama.cpp on the file gives against mreg's float32 reference.

Random weights make every quantization's KL larger and an importance matrix's gain smaller than on a trained
model: the table shows the encodings' relative cost here, not what a real checkpoint loses.

`--only llama-tools` (`bench_llama_tools`), on the same checkpoint: mreg's importance matrix of the shipped
calibration text against llama.cpp's own `llama-imatrix` on the same text (F32 file, `-c 512 -t 2`), the two
matrices compared; then `mreg convert --to gguf:Q4_K_M --imatrix` with mreg's matrix against
`convert_hf_to_gguf.py --outtype f16` + `llama-quantize --imatrix` with the same file, wall time, memory and
tensor bytes. The tools are built from the sdist (tests/support/llama_cpp_tools.py) into .nox/llama-tools.
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
    from bench_gguf import build_tinyllama, llama_cpp_or_none

    llama_cpp = llama_cpp_or_none(work, "quality")
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


def _tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    import gguf

    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in gguf.GGUFReader(path).tensors}


def _same_tensors(a: Path, b: Path) -> dict[str, Any]:
    """How many tensors two GGUF files share by name, type and bytes."""
    ta, tb = _tensors(a), _tensors(b)
    differ = sorted(n for n in ta.keys() & tb.keys() if ta[n] != tb[n])
    return {"tensors": len(ta), "only_in_one": sorted(ta.keys() ^ tb.keys()), "differ": differ[:10],
            "differ_count": len(differ), "equal": not differ and ta.keys() == tb.keys()}


def compare_importance(ours: Path, theirs: Path) -> dict[str, Any]:
    """Entries, chunking, counts and sums of two importance matrices (mreg's reading of each file)."""
    import numpy as np

    from converters.gguf import imatrix

    a, b = imatrix.read(ours), imatrix.read(theirs)
    common = sorted(a.sums.keys() & b.sums.keys())
    rel = {n: float(np.linalg.norm(a.sums[n].astype(np.float64) - b.sums[n]) / np.linalg.norm(b.sums[n]))
           for n in common}
    worst = {n: float(np.max(np.abs(a.sums[n].astype(np.float64) - b.sums[n]) / np.maximum(b.sums[n], 1e-30)))
             for n in common}
    return {"entries": [len(a.sums), len(b.sums)], "same_entries": sorted(a.sums) == sorted(b.sums),
            "chunks": [[a.chunk_count, a.chunk_size], [b.chunk_count, b.chunk_size]],
            "counts_equal": all(np.array_equal(a.counts[n], b.counts[n]) for n in common),
            "tokens_per_entry": sorted({int(b.counts[n].sum()) for n in common}),
            "sums_rel_l2_median": float(np.median(list(rel.values()))), "sums_rel_l2_max": max(rel.values()),
            "sums_rel_l2_max_entry": max(rel, key=lambda n: rel[n]),
            "sums_elementwise_rel_max": max(worst.values())}


def _gguf_convert(mreg: str, src: Path, name: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    """`mreg convert SRC --to gguf:Q4_K_M` timed and sampled; the file it wrote and its manifest's figures."""
    from bench_gguf import _timed

    wall, mem, stdout = _timed([mreg, "convert", str(src), "--to", "gguf:Q4_K_M", "--name", name, *extra, "--json"],
                               env, warm=[src])
    doc = json.loads(stdout)
    version = Path(env["MREG_STORE"]) / "models" / name / "versions" / str(doc["version"])
    art = next(a for a in json.loads((version / "manifest.json").read_text())["artifacts"] if a["format"] == "gguf")
    big = max(art["files"], key=lambda f: f["size"])
    return {"wall_s": round(wall, 2), **mem, "duration_s": art["duration_s"],
            "file": str(version / art["path"] / big["path"]), "verification": art["verification"]["status"],
            "imatrix": art["requirements"].get("imatrix")}


def bench_llama_tools(work: Path, results: dict[str, Any]) -> None:
    """mreg's importance matrix and Q4_K_M with it, against llama.cpp's own llama-imatrix and llama-quantize.

    The user's llama.cpp path to Q4_K_M is `convert_hf_to_gguf.py --outtype f16` then `llama-quantize`; F16 rounds
    the bf16 checkpoint's smallest weights (below F16's normal range), so its bytes are compared too with
    `llama-quantize` run on the F32 file (which holds them exactly) that llama-imatrix reads.
    """
    from bench_gguf import _convert_hf_to_gguf, _timed, build_tinyllama
    from support.llama_cpp_source import source
    from support.llama_cpp_tools import build, imatrix_command, quantize_command

    from converters.gguf import imatrix

    llama_cpp = source(work / "llama-cpp-source", allow_download=True)
    nox_dir = Path(__file__).parents[1] / ".nox"
    tools = build(nox_dir / "llama-tools" if nox_dir.is_dir() else work / "llama-tools")
    out: dict[str, Any] = {"tools_build_s": tools.build_seconds, "tools_cached": tools.cached, "threads": 2}
    print(f"llama-tools: built in {tools.build_seconds} s (cached: {tools.cached})", flush=True)
    src, out["tokenizer"] = build_tinyllama(work / "tinyllama", llama_cpp)
    text = imatrix.DEFAULT_CALIBRATION
    env = {**os.environ, "MREG_CACHE_DIR": str(work / "t-cache"), "MREG_STORE": str(work / "t-store")}
    ref_env = {**env, "PYTHONPATH": "gguf-py"}
    child_env = {**env, "OPENBLAS_NUM_THREADS": "1",
                 "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])}

    def step(key: str, cmd: list[str], run_env: dict[str, str], cwd: Path | None = None,
             warm: tuple[Path, ...] = ()) -> str:
        wall, mem, stdout = _timed(cmd, run_env, cwd=cwd, warm=warm)
        out[key] = {"wall_s": round(wall, 2), **mem, "command": " ".join(Path(c).name if "/" in c else c
                                                                          for c in cmd)}
        print(f"llama-tools {key}: {out[key]}", flush=True)
        return stdout

    # (a) the importance matrix: mreg's child process (what `--calibration default` runs) against llama-imatrix on
    # the F32 file (the precision of mreg's pass; llama.cpp's F16 path rounds activations to F16 in the products)
    ours = work / "mreg.imatrix.gguf"
    step("mreg_imatrix", [sys.executable, "-m", "converters.gguf.imatrix", str(src), str(text), str(ours), "512",
                          text.name], child_env, warm=(src,))
    f32 = work / "tinyllama-F32.gguf"
    step("convert_hf_to_gguf_f32", _convert_hf_to_gguf(src, f32, "f32"), ref_env, cwd=llama_cpp, warm=(src,))
    theirs = work / "llama.imatrix.gguf"
    step("llama_imatrix", imatrix_command(tools, f32, text, theirs), env, warm=(f32,))
    # the byte comparison's input: the F32 file holds the bf16 weights exactly (F16 rounds the smallest ones)
    q4_f32 = work / "llama-Q4_K_M-from-F32.gguf"
    step("llama_quantize_from_f32", quantize_command(tools, f32, q4_f32, "Q4_K_M", ours), env, warm=(f32,))
    f32.unlink()
    out["imatrix_comparison"] = compare_importance(ours, theirs)
    print(f"llama-tools imatrix comparison: {out['imatrix_comparison']}", flush=True)
    # (b) Q4_K_M with mreg's matrix: `mreg convert --imatrix` against convert_hf_to_gguf F16 + llama-quantize --imatrix
    out["mreg_q4_k_m"] = _gguf_convert(mreg_exe(), src, "t-q4km", env, "--imatrix", str(ours))
    print(f"llama-tools mreg Q4_K_M: {out['mreg_q4_k_m']}", flush=True)
    f16, q4 = work / "tinyllama-F16.gguf", work / "llama-Q4_K_M.gguf"
    step("convert_hf_to_gguf_f16", _convert_hf_to_gguf(src, f16, "f16"), ref_env, cwd=llama_cpp, warm=(src,))
    step("llama_quantize", quantize_command(tools, f16, q4, "Q4_K_M", ours), env, warm=(f16,))
    f16.unlink()
    mine = Path(out["mreg_q4_k_m"]["file"])
    out["q4_k_m_tensors_vs_f16_path"] = _same_tensors(mine, q4)
    out["q4_k_m_tensors_vs_f32_path"] = _same_tensors(mine, q4_f32)
    print(f"llama-tools Q4_K_M tensors: F16 path {out['q4_k_m_tensors_vs_f16_path']}, "
          f"F32 path {out['q4_k_m_tensors_vs_f32_path']}", flush=True)
    # mreg takes llama-imatrix's file: the same reading and fit check `--imatrix` does before converting
    from converters.gguf.plan import plan

    imatrix.check_fits(imatrix.read(theirs), plan(src, sorted(src.glob("*.safetensors")), "F32", "m").model,
                       theirs.name)
    out["mreg_reads_llama_imatrix"] = True
    results["llama_tools_1.1B"] = out


def mreg_exe() -> str:
    """The mreg entry point of this interpreter's environment."""
    return str(Path(sys.executable).parent / "mreg")
