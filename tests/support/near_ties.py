"""Rows on which a near-tie decides a K-quant kernel's bytes, and the search that found them.

The kernels (`converters/gguf/quants/_native.c`) must do llama.cpp's float operations in llama.cpp's order. Most
reorderings show on any data; some change a result by one unit in the last place, which flips a decision only
where two candidates (two trial scales, two quants) are within that unit of each other: a few rows in tens of
millions. Random tests miss those. This module keeps such rows, found by a search against a kernel with one
reordering (a "mutation"), as the seed and row of a generator, so a test can hold the true kernel to llama.cpp's
bytes on them.

Search (a C compiler; each build ~10 s):

    cd tests && python -m support.near_ties QTYPE 'ORIGINAL' 'MUTATED' [--weighted] [--seeds 0:200]

builds `_native.c` alone for this CPU twice, the second with ORIGINAL replaced by MUTATED (it must occur
once), encodes each seed's rows with both and prints the seeds and rows whose bytes differ.
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from converters.gguf.quants import BLOCK
from support.kernel_builds import SOURCE, build_one_target

ROWS, COLS = 256, 4096
#: The K-quants, whose kernels have a weighted entry point too.
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

#: (type, weighted, seed, row, what it catches): rows the search found, each against the mutation named (found on
#: 2026-12-04 with `--seeds 0:2400` for Q3_K, `--seeds 0:600` for Q4_K).
CASES: list[tuple[str, bool, int, int, str]] = [
    ("Q3_K", False, 1269, 52, "make_q3_quants' new quant as x * (sl2 / slx)"),
    ("Q3_K", False, 1901, 56, "make_q3_quants' new quant as x * (sl2 / slx)"),
    ("Q4_K", True, 276, 196, "make_qp_quants' new quant as x * (sl2 / slx)"),
    ("Q4_K", True, 279, 121, "make_qp_quants' new quant as x * (sl2 / slx)"),
    ("Q4_K", True, 429, 153, "make_qp_quants' new quant as x * (sl2 / slx)"),
    ("Q4_K", True, 580, 6, "make_qp_quants' new quant as x * (sl2 / slx)"),
]


def rows(seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Seed's (ROWS, COLS) float32 rows and its COLS importance weights: the distribution cycles with the seed
    (small integers, halves, normals kept to 4 or 8 mantissa bits, scaled small integers, plain normals)."""
    rng = np.random.default_rng(seed)
    n, kind = ROWS * COLS, seed % 6
    if kind == 0:
        x = rng.integers(-9, 10, n).astype(np.float32)
    elif kind == 1:
        x = (rng.integers(-33, 34, n) * 0.5).astype(np.float32)
    elif kind in (2, 3):
        keep = np.uint32(0xFFF00000 if kind == 2 else 0xFFFF0000)
        x = (rng.standard_normal(n).astype(np.float32).view(np.uint32) & keep).view(np.float32)
    elif kind == 4:
        x = rng.integers(-3, 4, n).astype(np.float32) * np.float32(rng.choice([1, 3, 5, 7]))
    else:
        x = rng.standard_normal(n).astype(np.float32)
    weights = [np.ones(COLS, np.float32), rng.integers(1, 5, COLS).astype(np.float32),
               (rng.random(COLS) ** 6 * 40).astype(np.float32)][seed % 3]
    return x.reshape(ROWS, COLS), weights


def encode(lib: ctypes.CDLL, qtype: str, x: np.ndarray[Any, Any],
           w: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """Rows of `x` encoded by one build's kernel for `qtype` (with importance weights `w`), one row of bytes each."""
    nb = x.size // 256
    y = np.zeros(nb * BLOCK[qtype][1], np.uint8)
    name = f"mreg_quantize_{qtype.lower()}" + ("_w" if w is not None else "")
    if w is None:
        getattr(lib, name)(x.ctypes.data, y.ctypes.data, nb)
    else:
        getattr(lib, name)(x.ctypes.data, y.ctypes.data, nb, w.ctypes.data, COLS // 256, 0)
    return y.reshape(x.shape[0], -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("qtype", choices=K_QUANTS)
    parser.add_argument("original")
    parser.add_argument("mutated")
    parser.add_argument("--weighted", action="store_true")
    parser.add_argument("--seeds", default="0:200")
    args = parser.parse_args()
    text = SOURCE.read_text()
    if text.count(args.original) != 1:
        parser.error("ORIGINAL must occur exactly once in _native.c")
    first, last = (int(v) for v in args.seeds.split(":"))
    with tempfile.TemporaryDirectory() as tmp:
        true = build_one_target(Path(tmp) / "true.so", "native")
        mutant = build_one_target(Path(tmp) / "mutant.so", "native", text.replace(args.original, args.mutated))
        for seed in range(first, last):
            x, w = rows(seed)
            weights = w if args.weighted else None
            with np.errstate(all="ignore"):
                differ = np.nonzero((encode(true, args.qtype, x, weights)
                                     != encode(mutant, args.qtype, x, weights)).any(axis=1))[0]
            if differ.size:
                print(f"seed {seed}: rows {differ[:8].tolist()} ({differ.size} differ)", flush=True)


if __name__ == "__main__":
    main()
