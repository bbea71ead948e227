"""The first GGUF conversion from a checkpoint directory: `mreg pull DIR` then `mreg convert --to gguf:T`, cold.

`python benchmarks/bench_firstrun.py WORKDIR [--types F16,Q8_0] [--shape tinyllama|llama2-7b] [--repeat N]`: the
TinyLlama-shaped (1.1 B) or Llama-2-7B-shaped (6.7 B, 13.5 GB) bf16 checkpoint of `bench_gguf` (built once
in WORKDIR), then per type, from an empty cache and store, the pull and the conversion
back to back (the page cache dropped before the pull only: a first run reads what the pull just wrote), beside
llama.cpp's `convert_hf_to_gguf.py` on the same directory, the page cache dropped before it too. Prints one
JSON line per type: seconds of each step, mreg's metrics (write, verify, reference) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).parent))

from bench_gguf import LLAMA2_7B, TINYLLAMA, _convert_hf_to_gguf, build_tinyllama, settle

SHAPES = {"tinyllama": TINYLLAMA, "llama2-7b": LLAMA2_7B}


def _run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"{cmd} exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def first_run(work: Path, src: Path, qtype: str, llama_cpp: Path) -> dict[str, Any]:
    """Pull and convert from an empty cache and store, then convert_hf_to_gguf.py, each from a dropped page cache."""
    cache, store = work / "fr-cache", work / "fr-store"
    for d in (cache, store):
        shutil.rmtree(d, ignore_errors=True)
    mreg = str(Path(sys.executable).parent / "mreg")
    env = {**os.environ, "MREG_CACHE_DIR": str(cache), "MREG_STORE": str(store)}
    settle([src])
    pull_s, _ = _run([mreg, "pull", str(src), "--json"], env)
    convert_s, out = _run([mreg, "convert", str(src), "--to", f"gguf:{qtype}", "--name", "fr", "--json"], env)
    doc = json.loads(out)
    manifest = json.loads((store / "models" / "fr" / "versions" / str(doc["version"]) / "manifest.json").read_text())
    (art,) = manifest["artifacts"]
    m = art["verification"]["metrics"]
    ref = work / f"fr-ref-{qtype}.gguf"
    settle([src])
    ref_s, _ = _run(_convert_hf_to_gguf(src, ref, qtype.lower()), {**env, "PYTHONPATH": "gguf-py"}, cwd=llama_cpp)
    ref.unlink(missing_ok=True)
    for d in (cache, store):
        shutil.rmtree(d, ignore_errors=True)
    total = pull_s + convert_s
    return {"type": qtype, "pull_s": round(pull_s, 2), "convert_s": round(convert_s, 2), "mreg_s": round(total, 2),
            "write_s": m.get("write_seconds"), "verify_s": m.get("verify_seconds"),
            "reference_s": m.get("reference_seconds"), "verification": art["verification"]["status"],
            "kl": m.get("kl_divergence"), "convert_hf_to_gguf_s": round(ref_s, 2), "ratio": round(total / ref_s, 2)}


def checkpoint(work: Path, shape: str, llama_cpp: Path) -> Path:
    """The bf16 checkpoint of `shape` in `work`, built once."""
    src = work / shape
    if not (src / "model.safetensors.index.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        build_tinyllama(src, llama_cpp, SHAPES[shape])
    return src


def bench_firstrun(work: Path, results: dict[str, Any], shape: str = "tinyllama",
                   types: tuple[str, ...] = ("F16", "Q8_0")) -> None:
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
    parser.add_argument("--types", default="F16,Q8_0")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama")
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
            row = first_run(work, src, qtype, llama_cpp)
            ratios.append(row["ratio"])
            print(json.dumps(row), flush=True)
        if args.repeat > 1:
            print(json.dumps({"type": qtype, "pairs": len(ratios), "median_ratio": statistics.median(ratios),
                              "ratios": ratios}), flush=True)


if __name__ == "__main__":
    main()
