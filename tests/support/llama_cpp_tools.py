"""llama.cpp's own `llama-imatrix` and `llama-quantize`, built from llama-cpp-python's source package.

The tools link llama.cpp's `common/` library (argument parsing, chat templates, JSON, downloads). Only that
library, cpp-httplib (which `common/` links) and the two tools' sources are compiled here, with g++,
straight from the sdist's `vendor/llama.cpp`; ggml and libllama are not rebuilt: the binaries link the
installed llama-cpp-python's `libllama.so` and `libggml*.so`, built from the same sdist (same version, same
ABI), so the forward pass and the quantizers that define the results are the ones every other test runs.
The tools' own sources are compiled as llama.cpp's Release build compiles them (-O3 -DNDEBUG); `common/`,
whose code only parses arguments and loads files here, at `COMMON_OPT` (the build's cost is in it).

```
<cache>/llama-tools-<sdist sha256[:16]>-<key[:12]>/   key: libllama.so's sha256 and the flags
    llama-imatrix  llama-quantize  build.json (seconds, flags, sources)
```
The directory is built under a temporary name and renamed: the second use is instant, and a build killed
midway leaves nothing that looks complete.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from registry.digest import sha256_file
from support.llama_cpp_native import _lib_dir
from support.llama_cpp_source import SDIST_ENV, Unavailable

#: Optimization of `common/` (argument parsing, file loading; nothing the results depend on).
COMMON_OPT = "-O1"
#: What llama.cpp's CMake Release build gives the tools' own sources (imatrix.cpp's accumulation is there).
TOOL_OPT = "-O3"
#: The parts of vendor/llama.cpp the build reads.
#: (`src/llama-ext.h`: common/fit.cpp and common/speculative.cpp include libllama's staging API as ../src/)
_TREES = ("common/", "include/", "ggml/include/", "src/llama-ext.h", "vendor/nlohmann/", "vendor/sheredom/",
          "vendor/cpp-httplib/", "tools/imatrix/", "tools/quantize/")
#: Sources CMake lists for common/ only behind an option (LLAMA_LLGUIDANCE).
_SKIP = ("common/llguidance.cpp",)
_TOOLS = {"llama-imatrix": ("tools/imatrix/imatrix.cpp",),
          "llama-quantize": ("tools/quantize/main.cpp", "tools/quantize/quantize.cpp")}
#: cpp-httplib's definitions in vendor/cpp-httplib/CMakeLists.txt.
_HTTPLIB_DEFS = ("-DCPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH=1048576", "-DCPPHTTPLIB_LISTEN_BACKLOG=512",
                 "-DCPPHTTPLIB_REQUEST_URI_MAX_LENGTH=32768", "-DCPPHTTPLIB_TCP_NODELAY=1")


@dataclass(frozen=True)
class Tools:
    """The two binaries, and what building them cost (0 when they came from the cache)."""

    imatrix: Path
    quantize: Path
    build_seconds: float
    cached: bool


def _sdist() -> Path:
    archive = os.environ.get(SDIST_ENV)
    if not archive:
        raise Unavailable(f"set {SDIST_ENV} to llama-cpp-python's source package (`nox -s tests` does)")
    return Path(archive)


def _extract(archive: Path, dest: Path) -> Path:
    """The parts of vendor/llama.cpp the build reads, under dest."""
    with tarfile.open(archive) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(_TREES)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(dest, members=members, filter="data")
    if not all((dest / src).is_file() for srcs in _TOOLS.values() for src in srcs):
        raise Unavailable(f"{archive.name} lacks llama.cpp's tools/imatrix or tools/quantize")
    return dest


def _build_info(tree: Path, out: Path) -> Path:
    """common/build-info.cpp from its template, as CMake's configure_file writes it (no git here)."""
    text = (tree / "common" / "build-info.cpp.in").read_text()
    for key, value in {"LLAMA_BUILD_NUMBER": "0", "LLAMA_BUILD_COMMIT": "sdist", "BUILD_COMPILER": "g++",
                       "BUILD_TARGET": "x86_64-linux-gnu"}.items():
        text = text.replace(f"@{key}@", value)
    out.write_text(text)
    return out


def _common_sources(tree: Path) -> list[Path]:
    found = [p for pattern in ("common/*.cpp", "common/jinja/*.cpp", "common/parsers/*.cpp")
             for p in tree.glob(pattern) if str(p.relative_to(tree)) not in _SKIP]
    return [*found, tree / "vendor" / "cpp-httplib" / "httplib.cpp"]


def _compile(tree: Path, src: Path, obj: Path, opt: str) -> None:
    defs = _HTTPLIB_DEFS if src.name == "httplib.cpp" else ()
    cmd = ["g++", opt, "-DNDEBUG", "-std=c++17", "-fPIC", "-w", "-pthread", *defs, f"-I{tree / 'common'}",
           f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}", f"-I{tree / 'vendor'}",
           f"-I{tree / 'tools' / 'quantize'}", "-c", str(src), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise AssertionError(f"g++ failed on {src.relative_to(tree)}: {done.stderr[-2000:]}")


def _build(archive: Path, lib: Path, dest: Path, jobs: int) -> None:
    """Extract, compile (`jobs` at a time, largest sources first), archive common/, link both tools into dest."""
    tree = _extract(archive, dest / "src")
    objs = dest / "obj"
    objs.mkdir()
    common = [*_common_sources(tree), _build_info(tree, objs / "build-info.cpp")]
    tools = sorted({s for srcs in _TOOLS.values() for s in srcs})
    work = [(src, COMMON_OPT) for src in common] + [(tree / s, TOOL_OPT) for s in tools]
    work.sort(key=lambda w: w[0].stat().st_size, reverse=True)

    def obj_of(src: Path) -> Path:
        return objs / (str(src.relative_to(tree if src.is_relative_to(tree) else objs)).replace("/", "_") + ".o")

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        for f in [pool.submit(_compile, tree, src, obj_of(src), opt) for src, opt in work]:
            f.result()
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure, compile nothing more
    archive_a = objs / "libllama-common.a"
    subprocess.run(["ar", "rcs", str(archive_a), *(str(obj_of(s)) for s in common)], check=True)
    for name, srcs in _TOOLS.items():
        cmd = ["g++", "-pthread", "-o", str(dest / name), *(str(obj_of(tree / s)) for s in srcs), str(archive_a),
               f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise AssertionError(f"linking {name} failed: {done.stderr[-2000:]}")
    shutil.rmtree(tree)
    shutil.rmtree(objs)


def build(cache: Path, jobs: int = 2) -> Tools:
    """`llama-imatrix` and `llama-quantize` of the sdist named by MREG_LLAMA_CPP_SDIST, built once into cache."""
    if shutil.which("g++") is None or shutil.which("ar") is None:
        raise Unavailable("g++ (and binutils' ar) are not installed")
    archive, lib = _sdist(), _lib_dir()
    flags = f"common {COMMON_OPT}, tools {TOOL_OPT}"
    key = hashlib.sha256(f"{sha256_file(lib / 'libllama.so')} {flags}".encode()).hexdigest()
    root = cache / f"llama-tools-{sha256_file(archive)[:16]}-{key[:12]}"
    if (root / "build.json").is_file():
        return Tools(root / "llama-imatrix", root / "llama-quantize", 0.0, cached=True)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".building-") as tmp:
        out = Path(tmp) / "tools"
        out.mkdir()
        _build(archive, lib, out, jobs)
        seconds = round(time.monotonic() - t0, 1)
        (out / "build.json").write_text(json.dumps({"seconds": seconds, "jobs": jobs, "flags": flags,
                                                    "sdist": archive.name, "lib": str(lib)}))
        try:
            out.rename(root)
        except OSError:  # another process has just put a complete build there
            if not (root / "build.json").is_file():
                raise
    return Tools(root / "llama-imatrix", root / "llama-quantize", seconds, cached=False)


def imatrix_command(tools: Tools, model: Path, text: Path, dest: Path, ctx: int = 512, threads: int = 2,
                    ppl: bool = True) -> list[str]:
    """`llama-imatrix -m MODEL -f TEXT -o DEST -c CTX -t THREADS` (GGUF output, its default)."""
    return [str(tools.imatrix), "-m", str(model), "-f", str(text), "-o", str(dest), "-c", str(ctx), "-t",
            str(threads), *([] if ppl else ["--no-ppl"])]


def quantize_command(tools: Tools, src: Path, dest: Path, qtype: str, imatrix: Path | None,
                     threads: int = 2) -> list[str]:
    """`llama-quantize [--imatrix FILE] SRC DEST TYPE THREADS`."""
    return [str(tools.quantize), *(["--imatrix", str(imatrix)] if imatrix else []), str(src), str(dest), qtype,
            str(threads)]


def run(cmd: list[str], timeout: float = 900) -> str:
    """Run one of the tools; its log (stderr and stdout) when it succeeds."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): "
                             f"{(done.stderr + done.stdout)[-2000:]}")
    return done.stderr + done.stdout
