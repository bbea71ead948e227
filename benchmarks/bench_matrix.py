"""A conversion matrix run by a local driver: 3 tiny models x 4 targets, each item its own `mreg convert --matrix M
--item N` process, with 1, 2 and 4 concurrent workers against one shared local store (or, with --s3, one S3 bucket
served by SeaweedFS on loopback, as runners that share only a bucket); then the same matrix run again (the work it
does must be none). Prints one JSON document.

    python benchmarks/bench_matrix.py [--workers 1,2,4] [--targets hf,gguf:F16,gguf:Q8_0,onnx] [--s3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from support.matrix_driver import MREG, run_matrix
from support.s3_server import running
from support.tiny_models import build_tiny_llama


def main() -> None:
    """Run the matrix at each worker count, each against a fresh store; print the timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--targets", default="hf,gguf:F16,gguf:Q8_0,onnx")
    parser.add_argument("--s3", action="store_true", help="a shared S3 store (SeaweedFS on loopback)")
    args = parser.parse_args()
    targets = args.targets.split(",")
    root = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    sources = [build_tiny_llama(root / f"tiny{i}", seed=i) for i in range(3)]
    env = {"MREG_CACHE_DIR": str(root / "cache"), "HOME": str(root)}
    runs = []
    with contextlib.ExitStack() as stack:
        if args.s3:
            env.update(stack.enter_context(running(root / "seaweed", "bench-matrix")).env)
        for workers in (int(w) for w in args.workers.split(",")):
            runs.append(_run(root, sources, targets, workers, env, args.s3))
    print(json.dumps({"targets": targets, "models": len(sources), "cpus": os.cpu_count(), "store": "s3" if args.s3
                      else "local", "machine": platform.processor() or platform.machine(), "runs": runs}, indent=2))


def _run(root: Path, sources: list[Path], targets: list[str], workers: int, env: dict[str, str],
         s3: bool) -> dict[str, object]:
    """One worker count against a fresh store: both runs' wall time and work."""
    store = f"s3://bench-matrix/store-{workers}" if s3 else root / f"store-{workers}"
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
    return {
        "workers": workers, "items": len(include),
        "first": {"wall_s": round(first_s, 2), "converted": sum(not d.get("reused", True) for d in first),
                  "failed": sum(d["exit_code"] != 0 for d in first)},
        "second": {"wall_s": round(second_s, 2), "converted": sum(not d.get("reused", True) for d in second),
                   "failed": sum(d["exit_code"] != 0 for d in second)},
        "versions": len({(d.get("name"), d.get("version")) for d in first if d["exit_code"] == 0}),
    }


if __name__ == "__main__":
    main()
