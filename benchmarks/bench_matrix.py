"""A conversion matrix run by a local driver: 3 tiny models x 4 targets, each item its own `mreg convert --matrix M
--item N` process, with 1, 2 and 4 concurrent workers against one shared local store; then the same matrix run again
(the work it does must be none). Prints one JSON document.

    python benchmarks/bench_matrix.py [--workers 1,2,4] [--targets hf,gguf:F16,gguf:Q8_0,onnx]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from support.matrix_driver import MREG, run_matrix
from support.tiny_models import build_tiny_llama


def main() -> None:
    """Run the matrix at each worker count, each against a fresh store; print the timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--targets", default="hf,gguf:F16,gguf:Q8_0,onnx")
    args = parser.parse_args()
    targets = args.targets.split(",")
    root = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    sources = [build_tiny_llama(root / f"tiny{i}", seed=i) for i in range(3)]
    env = {"MREG_CACHE_DIR": str(root / "cache"), "HOME": str(root)}
    runs = []
    for workers in (int(w) for w in args.workers.split(",")):
        store = root / f"store-{workers}"
        matrix = root / f"matrix-{workers}.toml"
        lines = [f'store = "{store}"']
        for i, src in enumerate(sources):
            lines += ["[[models]]", f'name = "m{i}"', f'source = "{src}"', f"targets = {json.dumps(targets)}"]
        matrix.write_text("\n".join(lines) + "\n")
        emitted = subprocess.run([*MREG, "plan", str(matrix), "--emit", "github"], capture_output=True, text=True,
                                 env={**os.environ, **env}, check=True)
        include = json.loads(emitted.stdout)["include"]
        first, first_s = run_matrix(matrix, include, workers=workers, env=env)
        second, second_s = run_matrix(matrix, include, workers=workers, env=env)
        runs.append({
            "workers": workers, "items": len(include),
            "first": {"wall_s": round(first_s, 2), "converted": sum(not d.get("reused", True) for d in first),
                      "failed": sum(d["exit_code"] != 0 for d in first)},
            "second": {"wall_s": round(second_s, 2), "converted": sum(not d.get("reused", True) for d in second),
                       "failed": sum(d["exit_code"] != 0 for d in second)},
            "versions": len(list((store / "models").glob("*/versions/*"))),
        })
    print(json.dumps({"targets": targets, "models": len(sources), "cpus": os.cpu_count(),
                      "machine": platform.processor() or platform.machine(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
