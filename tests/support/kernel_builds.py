"""mreg's kernels (`converters/gguf/quants/_native.c`) built alone for one target, outside the package.

The installed extension holds a clone per target and runs the one this CPU's resolver picks. The tests build the
others' code alone to compare their bytes, the benchmarks to time them, and the near-tie search
(`support.near_ties`) a variant of the source.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "converters" / "gguf" / "quants" / "_native.c"


def build_one_target(out: Path, target: str, text: str | None = None) -> ctypes.CDLL:
    """`_native.c` (or `text`, a variant of it) built alone for one clone's target ("avx2", "default": what the
    resolver would run on a CPU with only that; "native": this CPU's every extension, -march=native), loaded."""
    from converters.gguf.quants import load_kernels

    src = out.with_suffix(".c")
    src.write_text(SOURCE.read_text() if text is None else text)
    one = ["-march=native", '-DMREG_ONE_TARGET="default"'] if target == "native" else [f'-DMREG_ONE_TARGET="{target}"']
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-g0", "-ffp-contract=off", "-fno-math-errno", "-w", *one,
                    str(src), "-o", str(out)], check=True)
    return load_kernels(str(out))
