"""Two small C++ programs against llama.cpp's own library, built on the spot for the importance-matrix tests.

- `quantize_with_imatrix`: `llama_model_quantize` with an importance matrix loaded as llama.cpp's
  tools/quantize does (in_sum2 / counts per expert), i.e. `llama-quantize --imatrix`;
- `imatrix_by_eval_callback`: an importance matrix accumulated from llama.cpp's eval callback exactly as
  tools/imatrix/imatrix.cpp accumulates it, on the same chunks llama-imatrix feeds.

llama.cpp's own `llama-imatrix` and `llama-quantize` are built too (support/llama_cpp_tools.py, used by
test_llama_tools.py), but they link llama.cpp's `common/` library: 101 s of compiling on two cores. These
programs take the part that defines the result (the accumulation, the map handed to the quantizer) and
compile in about 3 s; the tests that run many quantizations (a mixture's experts, the dry-run type mixes)
use them. They are compiled with g++ against the headers of llama-cpp-python's
source package (`MREG_LLAMA_CPP_SDIST`, the version installed) and the installed package's
`libllama.so`, once per source/library/header combination, into a cache directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from support.llama_cpp_source import SDIST_ENV, Unavailable

NATIVE = Path(__file__).parent / "native"
#: The sdist's headers the programs include.
_HEADERS = ("include/", "ggml/include/")


def _lib_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise Unavailable("llama-cpp-python is not installed")
    lib = Path(spec.origin).parent / "lib"
    if not (lib / "libllama.so").is_file():
        raise Unavailable(f"{lib} has no libllama.so")
    return lib


def _headers(cache: Path) -> Path:
    """include/ and ggml/include/ of the sdist's llama.cpp, extracted once under cache."""
    archive = os.environ.get(SDIST_ENV)
    if not archive:
        raise Unavailable(f"set {SDIST_ENV} to llama-cpp-python's source package (`nox -s tests` does)")
    root = cache / f"headers-{hashlib.sha256(archive.encode()).hexdigest()[:12]}"
    if (root / "include" / "llama.h").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp, tarfile.open(archive) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(_HEADERS) and m.name.endswith(".h")]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(Path(tmp) / "tree", members=members, filter="data")
        shutil.rmtree(root, ignore_errors=True)
        (Path(tmp) / "tree").rename(root)
    return root


def build(name: str, cache: Path) -> Path:
    """The program `native/NAME.cpp`, compiled (once) into cache."""
    if shutil.which("g++") is None:
        raise Unavailable("g++ is not installed")
    lib = _lib_dir()
    src = NATIVE / f"{name}.cpp"
    key = hashlib.sha256(src.read_bytes() + str(lib).encode() + (lib / "libllama.so").read_bytes()[:1 << 16])
    exe = cache / f"{name}-{key.hexdigest()[:12]}"
    if exe.is_file():
        return exe
    headers = _headers(cache)
    tmp = exe.with_name(exe.name + f".{os.getpid()}")
    cmd = ["g++", "-O2", "-std=c++17", str(src), f"-I{headers / 'include'}", f"-I{headers / 'ggml' / 'include'}",
           f"-L{lib}", "-lllama", "-lggml-base", "-lggml", f"-Wl,-rpath,{lib}", "-o", str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"g++ failed on {src.name}: {done.stderr[-2000:]}")
    tmp.rename(exe)
    return exe


def quantize(exe: Path, src: Path, dest: Path, ftype: int, imatrix: Path | None) -> Path:
    """`llama-quantize [--imatrix FILE] SRC DEST FTYPE` (2 threads)."""
    cmd = [str(exe), str(src), str(dest), str(ftype), "2", *([str(imatrix)] if imatrix else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"llama_model_quantize failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return dest


_TENSOR_LINE = re.compile(r"^\[\s*\d+/\s*\d+\] (\S+)\s+- \[[^\]]*\], type =\s*(\w+), size = [^(]*(?:\((\w+)\))?\s*$")


def dry_run(exe: Path, src: Path, ftype: int, imatrix: Path | None) -> tuple[dict[str, str], bool]:
    """llama.cpp's `--dry-run`: the type it chooses for every tensor, and whether it would refuse without an
    importance matrix (nothing is quantized, so any type is fast)."""
    cmd = [str(exe), str(src), "/dev/null", str(ftype), "1", str(imatrix) if imatrix else "-", "dry"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"llama_model_quantize --dry-run failed (exit {done.returncode}): {done.stdout[-1500:]}")
    types = {}
    for line in done.stdout.splitlines():
        found = _TENSOR_LINE.match(line)
        if found:
            types[found[1]] = (found[3] or found[2]).upper()
    return types, "will require an imatrix" in done.stdout


def imatrix(exe: Path, model: Path, text: Path, chunk: int, dest: Path) -> Path:
    """llama.cpp's importance matrix of a GGUF model on a text (chunks of `chunk` tokens, 2 threads)."""
    done = subprocess.run([str(exe), str(model), str(text), str(chunk), str(dest), "2"], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"imatrix_by_eval_callback failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return dest
