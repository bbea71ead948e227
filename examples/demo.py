"""The main job end to end, offline, on built-in data (run by `nox -s demo`).

A tiny random Llama is built and served by a local hub on 127.0.0.1; the real `mreg` command
pulls it into an explicit cache, registers it in a local store, promotes it, registers a
retrained revision, promotes that, shows the path a serving engine mounts, and rolls back; then
it quantizes the retrained version to GGUF (and exports it to ONNX where mreg's `onnx` extra is
installed), releases that version and rolls it back too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from support.hub_server import LocalHub
from support.tiny_models import build_tiny_llama


def tree(d: Path) -> dict[str, bytes]:
    """Every file under a directory."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def main() -> int:
    """Run the demo in ./demo-work (wiped first)."""
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-work").absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "MREG_CACHE_DIR": str(work / "cache"), "MREG_STORE": str(work / "store"),
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "XDG_CONFIG_HOME": str(work / "config")}
    env.pop("HF_TOKEN", None)
    beside = Path(sys.executable).parent / "mreg"
    mreg = str(beside) if beside.exists() else (shutil.which("mreg") or "mreg")

    def run(*args: str, expect: int = 0) -> str:
        print(f"\n$ mreg {' '.join(args)}", flush=True)
        p = subprocess.run([mreg, *args], env=env, capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        sys.stdout.write("".join(f"  [stderr] {line}\n" for line in p.stderr.splitlines()))
        if p.returncode:
            print(f"  (exit {p.returncode})")
        if p.returncode != expect:
            raise SystemExit(f"demo failed: `mreg {' '.join(args)}` exited {p.returncode}, expected {expect}")
        return p.stdout.strip()

    with LocalHub() as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        print(f"local hub on {hub.endpoint} serving tiny/llama (built now, random weights, real tokenizer)")
        v1 = tree(build_tiny_llama(work / "src-v1", seed=1))
        first = hub.add_commit("tiny/llama", v1, message="initial")
        run("config")
        run("pull", "tiny/llama")
        run("convert", "tiny/llama", "--to", "hf", "--name", "tiny-llama")
        run("promote", "tiny-llama@1", "-m", "first release")
        v2 = tree(build_tiny_llama(work / "src-v2", seed=2))
        hub.add_commit("tiny/llama", v2, message="retrained")
        run("convert", "tiny/llama", "--to", "hf", "--name", "tiny-llama")
        run("convert", "tiny/llama", "--to", "hf", "--name", "tiny-llama")  # same inputs: the existing version
        run("promote", "tiny-llama@2", "--expect", "1", "-m", "retrained weights")
        run("promote", "tiny-llama@1", "--expect", "1", expect=5)  # a CI job that lost the race
        mount = Path(run("resolve", "tiny-llama@production", "--format", "hf"))
        assert tree(mount) == v2, "production serves the retrained weights"
        print(f"\nan engine mounts {work / 'store'} and reads {mount}:")
        for name in sorted(os.listdir(mount)):
            print(f"  {name}")
        run("rollback", "tiny-llama", "-m", "bad answers in canary")
        assert tree(mount) == v1, "the same path now serves the first version"
        print(f"\nafter the rollback the same path serves {first[:12]} again")
        run("history", "tiny-llama")
        run("list", "tiny-llama")
        run("verify", "--all")
        run("pull", str(work / "src-v1"))  # an air-gapped mirror: a local directory, hashed the same way
        run("show", "tiny-llama@production")
        run("mount-check", "tiny-llama", "--mount-root", "/models")  # paths inside a container mounting the store
        # The format follows the hardware: a CPU/edge build of the retrained version, carrying its hf files.
        targets = ["--to", "gguf:Q4_K_M"]
        formats = ["hf", "gguf"]
        if all(importlib.util.find_spec(m) for m in ("torch", "transformers", "onnx", "onnxruntime")):
            targets += ["--to", "onnx"]
            formats.append("onnx")
        else:
            print("\n(ONNX skipped: install mreg[onnx] to export and verify it in ONNX Runtime too)")
        run("convert", "tiny-llama@2", *targets)  # version 3: hf carried as links, the new formats added
        run("promote", "tiny-llama@3", "--require", "gguf", "-m", "quantized for CPU serving")
        gguf = Path(run("resolve", "tiny-llama@production", "--format", "gguf"))
        print(f"\nllama.cpp opens {gguf} ({gguf.stat().st_size} bytes): `llama-server -m {gguf}`")
        run("rollback", "tiny-llama", "-m", "quantized answers drifted")
        run("list", "tiny-llama")
        run("verify", "--all")
    print(f"\ndemo complete: pull → convert ({', '.join(formats)}) → promote → resolve → rollback, all offline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
