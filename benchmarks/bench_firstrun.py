"""The first GGUF conversion from a checkpoint directory: `mreg pull DIR` then `mreg convert --to gguf:T`.

`python benchmarks/bench_firstrun.py WORKDIR [--types F16,Q8_0,Q4_K_M] [--shape tinyllama|llama2-7b]
[--cache warm|cold] [--repeat N]`: the TinyLlama-shaped (1.1 B) or Llama-2-7B-shaped (6.7 B, 13.5 GB) bf16
checkpoint of `bench_gguf` (built once in WORKDIR), then per type, from an empty cache and store, the pull and
the conversion back to back, beside llama.cpp's path to the same type on the same directory:
`convert_hf_to_gguf.py --outtype f16|q8_0`, and for the K-quant mixes `convert_hf_to_gguf.py --outtype f16`
followed by `llama-quantize F16 OUT TYPE 2` (llama.cpp's `llama_model_quantize`, 2 threads). Before each tool's
first step the page cache is dropped and, with `--cache warm` (the default: a CI runner that has just pulled the
checkpoint), the checkpoint read back in; with `--cache cold` it is left on disk. Each tool's later steps run as
they would in a script: a first run reads what the pull just wrote, llama-quantize what the converter just wrote.
Prints one JSON line per run: seconds of each step, the peak anonymous memory of each tool (the largest sum over
its process tree, sampled every 20 ms), mreg's metrics (write, verify, reference) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).parent))

from bench_gguf import LLAMA2_7B, TINYLLAMA, _convert_hf_to_gguf, build_tinyllama, llama_quantize_cmd, sampled, settle

SHAPES = {"tinyllama": TINYLLAMA, "llama2-7b": LLAMA2_7B}
#: llama.cpp's file types (`enum llama_ftype`) of the mixes llama-quantize makes from an F16 file.
FTYPES = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
          "Q5_K_M": 17, "Q6_K": 18}


def _step(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak anonymous MB and stdout of one step."""
    wall, mem, out = sampled(cmd, env, cwd)
    return wall, mem["peak_anon_mb"], out


def _reference(work: Path, src: Path, qtype: str, llama_cpp: Path, env: dict[str, str]) -> dict[str, Any]:
    """llama.cpp's path from the directory to `qtype`: its converter, then (K-quant mixes) its quantizer."""
    ref_env = {**env, "PYTHONPATH": "gguf-py"}
    outtype = "f16" if qtype in FTYPES else qtype.lower()
    converted, out = work / f"fr-ref-{outtype}.gguf", work / f"fr-ref-{qtype}.gguf"
    convert_s, convert_mb, _ = _step(_convert_hf_to_gguf(src, converted, outtype), ref_env, cwd=llama_cpp)
    row: dict[str, Any] = {"convert_hf_to_gguf_s": round(convert_s, 2)}
    total, peak = convert_s, convert_mb
    if qtype in FTYPES:
        quantize_s, quantize_mb, _ = _step(llama_quantize_cmd(converted, out, FTYPES[qtype]), env)
        row["llama_quantize_s"] = round(quantize_s, 2)
        total, peak = total + quantize_s, max(peak, quantize_mb)
        out.unlink(missing_ok=True)
    converted.unlink(missing_ok=True)
    return {**row, "llama_cpp_s": round(total, 2), "llama_cpp_peak_anon_mb": peak}


def first_run(work: Path, src: Path, qtype: str, llama_cpp: Path, cache: str = "warm") -> dict[str, Any]:
    """Pull and convert from an empty cache and store, then llama.cpp's path, each from the same page cache."""
    store_dirs = work / "fr-cache", work / "fr-store"
    for d in store_dirs:
        shutil.rmtree(d, ignore_errors=True)
    mreg = str(Path(sys.executable).parent / "mreg")
    env = {**os.environ, "MREG_CACHE_DIR": str(store_dirs[0]), "MREG_STORE": str(store_dirs[1])}
    warm = [src] if cache == "warm" else []
    settle(warm)
    pull_s, pull_mb, _ = _step([mreg, "pull", str(src), "--json"], env)
    convert_s, convert_mb, out = _step([mreg, "convert", str(src), "--to", f"gguf:{qtype}", "--name", "fr",
                                        "--json"], env)
    doc = json.loads(out)
    manifest = json.loads((store_dirs[1] / "models" / "fr" / "versions" / str(doc["version"])
                           / "manifest.json").read_text())
    (art,) = manifest["artifacts"]
    m = art["verification"]["metrics"]
    for d in store_dirs:
        shutil.rmtree(d, ignore_errors=True)
    settle(warm)
    ref = _reference(work, src, qtype, llama_cpp, env)
    total = pull_s + convert_s
    return {"type": qtype, "cache": cache, "pull_s": round(pull_s, 2), "convert_s": round(convert_s, 2),
            "mreg_s": round(total, 2), "write_s": m.get("write_seconds"), "verify_s": m.get("verify_seconds"),
            "reference_s": m.get("reference_seconds"), "verification": art["verification"]["status"],
            "kl": m.get("kl_divergence"), "encoders": art.get("tool_versions", {}).get("gguf-encoders"),
            "mreg_peak_anon_mb": max(pull_mb, convert_mb), **ref, "ratio": round(total / ref["llama_cpp_s"], 2)}


def checkpoint(work: Path, shape: str, llama_cpp: Path) -> Path:
    """The bf16 checkpoint of `shape` in `work`, built once."""
    src = work / shape
    if not (src / "model.safetensors.index.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        build_tinyllama(src, llama_cpp, SHAPES[shape])
    return src


def bench_firstrun(work: Path, results: dict[str, Any], shape: str = "tinyllama",
                   types: tuple[str, ...] = ("F16", "Q8_0", "Q4_K_M")) -> None:
    """`bench.py --only firstrun` (1.1 B) and `--only firstrun-7b` (needs about 45 GB of disk): one row per type."""
    from support.llama_cpp_source import source

    llama_cpp = source(work / "llama-cpp-source")
    src = checkpoint(work, shape, llama_cpp)
    results.setdefault("firstrun", {})[shape] = [first_run(work, src, t, llama_cpp) for t in types]


def main() -> None:
    """Build the checkpoint once, then one first run per type."""
    from support.llama_cpp_source import source

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--types", default="F16,Q8_0,Q4_K_M")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm",
                        help="warm: the checkpoint read into the page cache before each tool; cold: dropped")
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs of runs per type (this VM's speed drifts by a third within minutes: the median "
                             "ratio of several pairs, each pair back to back, is the figure to quote)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat takes a number of pairs, 1 or more")
    work: Path = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    llama_cpp = source(work / "llama-cpp-source")
    src = checkpoint(work, args.shape, llama_cpp)
    for qtype in args.types.split(","):
        ratios = []
        for _ in range(args.repeat):
            row = first_run(work, src, qtype, llama_cpp, args.cache)
            ratios.append(row["ratio"])
            print(json.dumps(row), flush=True)
        if args.repeat > 1:
            print(json.dumps({"type": qtype, "pairs": len(ratios), "median_ratio": statistics.median(ratios),
                              "ratios": ratios}), flush=True)


if __name__ == "__main__":
    main()
