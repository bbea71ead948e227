"""Encode time per million weights: mreg's native kernels against llama.cpp's `ggml_quantize_chunk`, one thread,
the same rows, the bytes checked equal (best of 7, the two interleaved).

    python benchmarks/bench_encoders.py [TYPE ...] [--imatrix] [--target avx2|default]
                                                    (default: Q6_K Q5_K Q4_K Q3_K Q2_K Q8_0)

Needs mreg's kernels built (`pip install -e .` with a C compiler) and llama-cpp-python. With --imatrix, every
column gets an importance weight (a skewed, fixed draw), as llama-quantize hands an importance matrix over. With
--target, the kernels are built alone for that clone's target (what a CPU with only AVX2, or only SSE2, runs) and
timed here instead of the clone this CPU's resolver picks.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from converters.gguf import quants
from converters.gguf.quants import NATIVE_TYPES, quantize

ROWS, COLS, RUNS = 1024, 4096, 7  # 4.19 M weights


def best(fn: Callable[[], object]) -> float:
    """The fastest of RUNS calls, in seconds."""
    out = []
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=[t for t in ("Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "Q8_0")
                                                         if t in NATIVE_TYPES])
    parser.add_argument("--imatrix", action="store_true", help="with an importance weight per column")
    parser.add_argument("--target", choices=("avx2", "default"), help="one clone's code, built alone")
    args = parser.parse_args()
    if args.target:
        sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
        from support.kernel_builds import build_one_target

        lib = build_one_target(Path(tempfile.mkdtemp()) / "kernels.so", args.target)
        quants._native_kernel = lambda: lib  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((ROWS, COLS)) * 0.02).astype(np.float32)
    weights = (rng.gamma(0.5, 1.0, COLS) + 1e-3).astype(np.float32) if args.imatrix else None
    for qtype in args.types:
        ours = quantize(x, qtype, use="native", importance=weights)
        theirs = quantize(x, qtype, use="ggml", importance=weights)
        assert ours.tobytes() == theirs.tobytes(), f"{qtype}: the kernels' bytes differ from llama.cpp's"
        native = best(functools.partial(quantize, x, qtype, use="native", importance=weights))
        ggml = best(functools.partial(quantize, x, qtype, use="ggml", importance=weights))
        per = 1e9 / x.size
        print(f"{qtype}{' imatrix' if weights is not None else ''}: mreg {native * per:.1f} ms per M weights, "
              f"ggml_quantize_chunk {ggml * per:.1f}, ratio {native / ggml:.2f} (bytes equal)")


if __name__ == "__main__":
    main()
